"""What a session already holds of a conversation, by the agent's own ids (SPEC §10 "Identity").

:class:`KnownIds` reads them from the log (item ids, turn ids, thread ids, with the turn that
holds them; failed turns' messages; commands stored with an exit code; the turns a run's end
follows) and keeps them in ``index/agent-ids`` (one JSON array a line, appended as the log
grows, with ``["@", length]`` marks of how much of the log it covers): it is caught up from the
log when the log grew past it and rebuilt when it is missing, torn, of another version, or names
another log file (its inode and first retained turn: a cap rewrite replaces the log) — the log
is the truth. What a capture has just appended is indexed from the lines it decoded
(:meth:`KnownIds.appended`) only when the log grew by exactly those lines since the index last
covered it; otherwise it is read. :mod:`memfs.ingest.identity` decides with it what a capture
adds.
"""

from __future__ import annotations

import errno
import os

import orjson

from memfs.agents import run_local_id
from memfs.errors import TurnNotFound
from memfs.events import _ENVELOPE_HEAD, decode_stored
from memfs.store.lines import split_lines
from memfs.store.paths import EVENTS, INDEX_DIR, atomic_write, ensure_private_dir, open_nofollow

AGENT_IDS = "index/agent-ids"
INDEX_VERSION = 3  # 2: failed turns' messages ("F"), commands with an exit code ("X"); 3: runs' ends ("E")

_CLOSES = frozenset(("turn.completed", "turn.failed"))
_ITEMS = frozenset(("item.started", "item.updated", "item.completed"))
OWN = float("inf")  # the turn "number" of an id this capture appended
FROM_MEMORY = True  # index what this capture appended from its decoded lines (KnownIds.appended)
_WRAP = len(_ENVELOPE_HEAD) + 1  # what the store adds to a bare event (memfs.events.parse_line)


# --- the session's known ids --------------------------------------------------------------------


def line_event(raw: bytes) -> tuple[dict | None, int]:
    """A translated line (bare event or envelope) as its event dict (or None), and the bytes
    the store adds when it accepts it (a bare event is wrapped)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, 0
    if type(obj) is not dict:
        return None, 0
    inner = obj.get("event")
    if "schema_version" in obj and type(inner) is dict:
        return inner, 0
    return obj, _WRAP


def facts(event: dict) -> tuple | None:
    """What :class:`KnownIds` indexes of one event of the log (None: nothing)."""
    etype = event.get("type")
    if etype in _ITEMS:
        iid = _item_id(event)
        return ("I", iid, _exit_code(event) is not None) if iid else None
    if etype == "turn.started":
        ctx = event.get("context") if type(event.get("context")) is dict else {}
        return ("T", 1 if _str(ctx.get("prompt")) else 0, _str(ctx.get("turn_id")))
    if etype in _CLOSES:
        sig = signature(event)
        failed = failed_message(event) if not sig and etype == "turn.failed" else None
        return ("C", _has_usage(event.get("usage")), sig, failed)
    if etype == "thread.started":
        tid = _str(event.get("thread_id"))
        return ("H", tid) if tid else None
    if etype == "thread.completed":
        return ("E",)
    return None


def _event_of(raw: bytes) -> dict | None:
    """A translated line (bare event or envelope) as its event dict, or None."""
    return line_event(raw)[0]


def _item_id(event: dict) -> str | None:
    item = event.get("item")
    iid = item.get("id") if type(item) is dict else None
    return iid if type(iid) is str and iid and not run_local_id(iid) else None


def _str(value) -> str | None:
    return value if type(value) is str and value else None


def _exit_code(event: dict) -> int | None:
    """A completed command's exit code (None: not a command's completion, or it has none)."""
    item = event.get("item")
    if event.get("type") != "item.completed" or type(item) is not dict or item.get("type") != "command_execution":
        return None
    code = item.get("exit_code")
    return code if type(code) is int else None


def _has_usage(usage) -> bool:
    return type(usage) is dict and any(type(v) is int and v > 0 for v in usage.values())


def signature(event: dict) -> tuple | None:
    """A completed turn's close as Codex identifies it across captures (the thread's running
    token total, :func:`memfs.agents.codex.shapes.turn_signature`), or None (a failed turn's message
    names no one turn)."""
    from memfs.agents.codex.shapes import turn_signature

    sig = turn_signature(event)
    return sig if sig and sig[0] == "completed" and any(sig[1:]) else None


def failed_message(event: dict) -> str:
    """A ``turn.failed``'s message, as :func:`memfs.agents.codex.shapes.turn_signature` reads it."""
    from memfs.agents.codex.shapes import turn_signature

    return turn_signature(event)[1]


class KnownIds:
    """The agent ids a session holds, each with the number of the turn holding it (an id
    outside turns counts with the next turn), from its log via ``index/agent-ids``."""

    def __init__(self, handle, *, write: bool = True):
        self.handle = handle
        self.write = write and not handle.read_only
        self.unwritten = False  # the index on disk is to be replaced at its next write
        self.items: dict[str, float] = {}
        self.turn_ids: dict[str, float] = {}
        self.threads: dict[str, float] = {}
        self.signatures: dict[tuple, float] = {}
        self.failed: dict[str, list] = {}  # a failed turn's message -> the turns it closed, in order
        self.exits: set[str] = set()  # ids of commands stored with their exit code
        self.ended: set[int] = set()  # turns a run's end (thread.completed) follows
        self.turns: dict[int, list] = {}  # number -> [has prompt, has usage, has turn id]
        self.cur = 0  # the last turn number seen
        self.in_turn = False
        self.covered = -1  # log bytes folded in (-1: not loaded)
        self.ino: list = []

    def _log_id(self) -> list:
        """Which log file the index describes: its inode and the first retained turn (a cap
        rewrite makes a new file and evicts at least one turn)."""
        try:
            ino = os.stat(self.handle.path / EVENTS).st_ino
        except OSError:
            ino = 0
        return [ino, self.handle.manifest.get("retained_turn_base", 1)]

    def _apply(self, rec: list) -> None:
        tag = rec[0]
        if tag == "T":
            n = rec[1]
            self.cur, self.in_turn = n, True
            self.turns[n] = [bool(rec[2]), False, False]
        elif tag == "K":
            self.turn_ids.setdefault(rec[2], rec[1])
            if rec[1] in self.turns:
                self.turns[rec[1]][2] = True
        elif tag == "U":
            if rec[1] in self.turns:
                self.turns[rec[1]][1] = True
        elif tag == "C":
            self.in_turn = False
        elif tag == "S":
            sig = tuple(rec[2])
            if self.signatures.get(sig, OWN) == OWN:
                self.signatures[sig] = rec[1]
        elif tag == "F":
            self.failed.setdefault(rec[2], []).append(rec[1])
        elif tag == "X":
            self.exits.add(rec[1])
        elif tag == "I":
            if self.items.get(rec[2], OWN) == OWN:
                self.items[rec[2]] = rec[1]
        elif tag == "H":
            if self.threads.get(rec[2], OWN) == OWN:
                self.threads[rec[2]] = rec[1]
        elif tag == "E":
            self.ended.add(rec[1])

    def _clear(self) -> None:
        """Nothing known, nothing covered."""
        self.items, self.turn_ids, self.threads, self.signatures, self.turns = {}, {}, {}, {}, {}
        self.failed, self.exits, self.ended = {}, set(), set()
        self.cur, self.in_turn, self.covered = 0, False, 0

    def _load(self) -> None:
        self._clear()
        self.ino = self._log_id()
        try:
            data = (self.handle.path / AGENT_IDS).read_bytes()
        except OSError:
            data = b""
        lines, cut = split_lines(data)
        ok = bool(data) and cut == len(data)
        if ok:
            try:
                head = orjson.loads(lines[0])
                ok = head == ["memfs-agent-ids", INDEX_VERSION, *self.ino]
            except orjson.JSONDecodeError:
                ok = False
        if ok:
            pending: list = []
            try:
                for line in lines[1:]:
                    rec = orjson.loads(line)
                    if rec[0] == "@":
                        for r in pending:
                            self._apply(r)
                        pending = []
                        self.covered = rec[1]
                    else:
                        pending.append(rec)
            except (orjson.JSONDecodeError, IndexError, TypeError, KeyError):
                ok = False
        if not ok or self.covered > self.handle.file_len:
            self._clear()
            if self.write and self.handle.file_len:
                self._write(b"", rewrite=True)
            self.unwritten = self.write and not self.handle.file_len  # (an empty log: with its first records)

    def _write(self, data: bytes, rewrite: bool = False) -> None:
        path = self.handle.path / AGENT_IDS
        if self.unwritten:  # the index of an empty log was not written: this write makes it
            rewrite, self.unwritten = True, False
        try:
            if rewrite:
                ensure_private_dir(self.handle.path / INDEX_DIR)
                atomic_write(path, orjson.dumps(["memfs-agent-ids", INDEX_VERSION, *self.ino]) + b"\n" + data)
                return
            fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:  # an index is a cache: a failure to keep it costs a rebuild later
            if exc.errno not in (errno.ENOENT, errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                raise

    def mark(self) -> tuple[int, int]:
        """Where the log ends now, and how often it was replaced: :meth:`appended`'s ``mark``."""
        return self.handle.file_len, self.handle.rewrites

    def refresh(self) -> set:
        """Catch up with the log (load or rebuild the index first when needed); returns the
        numbers of the turns the lines read now belong to (a rebuild does not count)."""
        floor = self.cur if self.in_turn else self.cur + 1
        if self.covered < 0 or self._log_id() != self.ino:
            self._load()
        end = self.handle.file_len
        if end < self.covered:  # the log shrank under us: start again
            self.covered = -1
            self._load()
        if end == self.covered:
            return set()
        read = [self.covered]

        def lines():
            for off, line in self.handle.iter_lines(self.covered):
                read[0] = off + len(line) + 1
                decoded = decode_stored(line)
                if decoded is not None:
                    yield off, facts(decoded[1])
        recs = self._fold(lines())
        return self._advance(recs, read[0], floor)

    def appended(self, mark: tuple[int, int], lines: list, accepted: int) -> set:
        """:meth:`refresh` after this capture appended ``lines`` — ``(raw, facts, wrap)``:
        :func:`facts` of the event :func:`line_event` decoded, and its ``wrap`` — of which the store accepted ``accepted``, from
        ``mark`` (:meth:`mark` before the append). When the index covered the log up to
        ``mark`` and the log gained exactly these lines since (same file, its length grown by
        their stored bytes), they are indexed from memory, as a read of the log would index
        them; otherwise the log is read."""
        start, rewrites = mark
        handle = self.handle
        if (not FROM_MEMORY or self.covered != start or accepted != len(lines) or handle.rewrites != rewrites
                or self._log_id() != self.ino):
            return self.refresh()
        floor = self.cur if self.in_turn else self.cur + 1
        located = []
        off = start
        for raw, f, wrap in lines:
            located.append((off, f))
            off += len(raw) + wrap + 1
        if off != handle.file_len:
            return self.refresh()
        return self._advance(self._fold(located), off, floor)

    def _advance(self, recs: list, covered: int, floor) -> set:
        """Record ``recs`` (the index now covers the log to ``covered``); the numbers of the
        turns they touch from ``floor`` on."""
        touched = {r[1] for r in recs if (len(r) > 2 or r[0] == "U") and r[1] >= floor}
        if covered == self.covered:
            return touched
        self.covered = covered
        if self.write:
            recs.append(["@", covered])
            self._write(b"".join(orjson.dumps(r) + b"\n" for r in recs))
        return touched

    def _fold(self, facts) -> list:
        """Fold the log's ``(offset, facts(event))`` pairs in, in order; returns the records made."""
        starts: dict | None = None  # turn numbers by start offset, read once a turn starts
        recs: list = []
        items = self.items
        for off, f in facts:
            if f is None:
                continue
            tag = f[0]
            if tag == "T":
                n = self.cur + 1
                try:
                    at = self.handle.turn_range(n)[0]  # (the common case: the next turn starts here)
                except TurnNotFound:
                    at = None
                if at != off:
                    if starts is None:
                        starts = {e["start_offset"]: e["turn_number"] for e in self.handle.turn_index
                                  if e["start_offset"] >= off}
                    n = starts.get(off, n)
                rec = ["T", n, f[1]]
                self._apply(rec)
                recs.append(rec)
                if f[2]:
                    recs.append(["K", n, f[2]])
                    self._apply(recs[-1])
            elif tag == "C":
                if self.in_turn:
                    if f[1]:
                        recs.append(["U", self.cur])
                        self._apply(recs[-1])
                    if f[2]:
                        recs.append(["S", self.cur, list(f[2])])
                        self._apply(recs[-1])
                    elif f[3] is not None:
                        recs.append(["F", self.cur, f[3]])
                        self._apply(recs[-1])
                    recs.append(["C"])
                    self._apply(recs[-1])
            elif tag == "I":
                iid = f[1]
                if items.get(iid, OWN) == OWN:  # (an item's later events add nothing)
                    n = self.cur if self.in_turn else self.cur + 1
                    recs.append(["I", n, iid])
                    items[iid] = n  # (as _apply does)
                if f[2] and iid not in self.exits:
                    recs.append(["X", iid])
                    self.exits.add(iid)
            elif tag == "E":
                if not self.in_turn and self.cur:
                    recs.append(["E", self.cur])
                    self._apply(recs[-1])
            else:  # "H"
                recs.append(["H", self.cur if self.in_turn else self.cur + 1, f[1]])
                self._apply(recs[-1])
        return recs
