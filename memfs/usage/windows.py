"""Billing blocks' boundaries (SPEC §12), as ccusage draws them: a pure function of sorted times,
light enough for ``memfs statusline`` (:mod:`memfs.usage.blocks` sums what falls in each).

A block starts at the hour floor (UTC) of its first entry and lasts :data:`BLOCK` (5 hours); an
entry more than 5 hours after the block's start, or more than 5 hours after the previous entry,
starts a new one. Between two blocks more than 5 hours apart lies a gap, from the last entry +
5 hours to the next block's start. A block is active while now is before its end and within 5
hours of its last entry.
"""

from __future__ import annotations

BLOCK = 5 * 3600


def split(times: list[float]) -> list[tuple[float, int, int, bool]]:
    """``(start, first, stop, gap)`` per block of ``times`` (sorted, seconds since the epoch):
    its entries are ``times[first:stop]``; a gap has none (``first == stop``) and ends at the
    next block's start."""
    out: list[tuple[float, int, int, bool]] = []
    start = last = 0.0
    first = 0
    for i, at in enumerate(times):
        if i == 0 or at - start > BLOCK or at - last > BLOCK:
            if i:
                out.append((start, first, i, False))
                if at - last > BLOCK and at - at % 3600 > last + BLOCK:
                    out.append((last + BLOCK, i, i, True))
            start, first = at - at % 3600, i
        last = at
    if times:
        out.append((start, first, len(times), False))
    return out


def active(start: float, last: float, now: float) -> bool:
    return now < start + BLOCK and now - last < BLOCK
