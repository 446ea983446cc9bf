"""Drafters that need no training of their own: copying from the source (alone, or before a trained drafter), and
looking continuations up in an n-gram store of the verifier's own outputs."""

from .ngram_store import NgramStore, is_ngram_store
from .ngram_store_drafter import NgramStoreDrafter, NgramStoreState, draft_from_store
from .source_copy import CopyOrFallbackProposal, SourceCopyDrafter, SourceCopyState, find_source_continuations

__all__ = [
    "CopyOrFallbackProposal",
    "NgramStore",
    "NgramStoreDrafter",
    "NgramStoreState",
    "SourceCopyDrafter",
    "SourceCopyState",
    "draft_from_store",
    "find_source_continuations",
    "is_ngram_store",
]
