"""Streamers a call hands on and ends: each ended once, also when the call fails or is refused.

A consumer iterating a `TextIteratorStreamer` in another thread waits for `end()`; transformers ends the streamer
when its loop finishes, not when `generate()` raises. Both routes into speculative decoding wrap the streamers they
are given (`ended_once`) and end them when the call fails (`ending_on_failure`): ending twice would queue a second
stop signal, which cuts short the next use of a reused streamer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["check_streamer", "ended_once", "ending_on_failure"]


class _EndedOnce:
    """A streamer passed through whose `end()` reaches it once, whoever calls it."""

    def __init__(self, streamer):
        self.streamer = streamer
        self.ended = False

    def put(self, value) -> None:
        self.streamer.put(value)

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self.streamer.end()


def ended_once(*streamers) -> list:
    """Each of `streamers` wrapped so that it is ended once (`None` kept; a wrapped one and an object passed twice
    get the same wrapper)."""
    wrapped = {}
    result = []
    for streamer in streamers:
        if streamer is not None and not isinstance(streamer, _EndedOnce):
            streamer = wrapped.setdefault(id(streamer), _EndedOnce(streamer))
        result.append(streamer)
    return result


@contextlib.contextmanager
def ending_on_failure(*streamers) -> Iterator[None]:
    """End each of `streamers` (as wrapped by `ended_once`; `None` skipped) when the block raises, then re-raise."""
    try:
        yield
    except BaseException:
        for streamer in streamers:
            if streamer is not None:
                # the call's own error is the one to raise, whatever ending the streamer meets
                with contextlib.suppress(Exception):
                    streamer.end()
        raise


def check_streamer(streamer) -> None:
    """Refuse a `streamer` without `put()` and `end()`, naming what was passed."""
    target = streamer.streamer if isinstance(streamer, _EndedOnce) else streamer
    if not (callable(getattr(target, "put", None)) and callable(getattr(target, "end", None))):
        raise ValueError(
            f"A streamer needs `put()` and `end()` (a transformers `BaseStreamer`), got {type(target).__name__}: "
            "pass a `TextStreamer` / `TextIteratorStreamer`, or none."
        )
