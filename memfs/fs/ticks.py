"""One-tick attribute timeouts for a session's metadata files (``manifest.json``,
``index/turns.json``).

``stat`` must report the size of the current content (SPEC §6), and with a timeout of 0 every
``stat``, ``open`` (its permission check) and ``fstat`` asks the server: three GETATTRs — each
generating the file — in the seven round trips of ``stat f; cat f``. Their content changes only
when the session does, so while no file of the session is open for writing in this mount the
reply carries :data:`ATTR_TICK`, which the kernel keeps until the next tick but one (HZ 250:
4–8 ms): one GETATTR per ``stat; cat``. Opening ``events.jsonl`` for writing withdraws it first
(:meth:`AttrTicks.untick`: the kernel forgets those attributes), so every change made through
this mount shows at the next ``stat``; a change by another process (a library writer,
``memfs import``) shows within that tick, as the spec's "short" timeouts allow. Not in cluster
mode, where a replica's appends change sessions without a file opened here.

A tick is remembered only while the kernel may still hold it: at most every :data:`TICK_HOLD`
seconds, when a tick is given, the ticks older than that are dropped: what is held is the
sessions ticked within two such periods of the latest tick, not every session ever ``stat``'d
(the root's ``user.memfs.attr_tick_sessions`` counts them).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pyfuse3

# The kernel rounds the timeout up to a tick, and keeps the attributes until the tick after.
ATTR_TICK = 0.001
TICK_HOLD = 0.1  # seconds after which a ticked reply surely expired (HZ ≥ 100: ≤ 20 ms)


class AttrTicks:
    """The ticks given and withdrawn by one mount (see the module)."""

    def __init__(self, store: Any):
        self.store = store
        self._ticked: dict[str, dict[int, float]] = {}  # session → {inode: when its attributes were ticked}
        self._swept = 0.0  # when _ticked was last swept of expired ticks
        self._lock = threading.Lock()  # (a file opened for writing on a worker thread unticks)
        self.ticked = 0  # replies that carried ATTR_TICK (the root's user.memfs.attr_ticked)
        self.unticked = 0  # of them, withdrawn before they expired (user.memfs.attr_unticked)

    @property
    def sessions(self) -> int:
        """Sessions with ticks the kernel may still hold (``user.memfs.attr_tick_sessions``)."""
        return len(self._ticked)

    def timeout(self, session: str, inode: int) -> float:
        """The attribute timeout of a metadata file of ``session`` with number ``inode``: a tick,
        or 0 while a file of the session is open for writing here."""
        with self._lock:
            held = self.store.held(session)
            if held is not None and held.writes.writers:
                return 0
            now = time.monotonic()
            if now - self._swept > TICK_HOLD:
                self._sweep(now - TICK_HOLD)
                self._swept = now
            self._ticked.setdefault(session, {})[inode] = now
            self.ticked += 1
        return ATTR_TICK

    def _sweep(self, expired: float) -> None:
        """Forget the ticks given before ``expired`` (caller holds the lock): the kernel no
        longer holds them, so :meth:`untick` would skip them anyway."""
        for name in list(self._ticked):
            inodes = self._ticked[name]
            for inode in [inode for inode, when in inodes.items() if when <= expired]:
                del inodes[inode]
            if not inodes:
                del self._ticked[name]

    def untick(self, session: str) -> None:
        """The kernel forgets the ticked attributes of ``session``."""
        with self._lock:
            ticked = self._ticked.pop(session, None)
            if not ticked:
                return
            recent = time.monotonic() - TICK_HOLD
            inodes = [inode for inode, when in ticked.items() if when > recent]
            self.unticked += len(inodes)
        for inode in inodes:
            try:
                pyfuse3.invalidate_inode(inode, attr_only=True)
            except OSError:  # (ENOENT: the kernel has forgotten the inode already)
                pass
