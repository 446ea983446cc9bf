"""Drafters that need no training of their own: copying from the source (alone, or before a trained drafter)."""

from .source_copy import CopyOrFallbackProposal, SourceCopyDrafter, SourceCopyState, find_source_continuations

__all__ = ["CopyOrFallbackProposal", "SourceCopyDrafter", "SourceCopyState", "find_source_continuations"]
