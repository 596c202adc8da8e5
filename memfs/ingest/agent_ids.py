"""What a session already holds of a conversation, by the agent's own ids (SPEC §10 "Identity").

:class:`KnownIds` reads them from the log (item ids, turn ids, thread ids, with the turn that
holds them; failed turns' messages; commands stored with an exit code) and keeps them in
``index/agent-ids`` (one JSON array a line, appended as the log grows, with ``["@", length]``
marks of how much of the log it covers): it is caught up from the log when the log grew past
it and rebuilt when it is missing, torn, of another version, or names another log file (its
inode and first retained turn: a cap rewrite replaces the log) — the log is the truth.
:mod:`memfs.ingest.identity` decides with it what a capture adds.
"""

from __future__ import annotations

import errno
import os

import orjson

from memfs.agents import run_local_id
from memfs.events import decode_stored
from memfs.store.lines import split_lines
from memfs.store.paths import EVENTS, INDEX_DIR, atomic_write, ensure_private_dir, open_nofollow

AGENT_IDS = "index/agent-ids"
INDEX_VERSION = 2  # 2: failed turns' messages ("F"), commands with an exit code ("X")

_CLOSES = frozenset(("turn.completed", "turn.failed"))
_ITEMS = frozenset(("item.started", "item.updated", "item.completed"))
OWN = float("inf")  # the turn "number" of an id this capture appended


# --- the session's known ids --------------------------------------------------------------------


def _event_of(raw: bytes) -> dict | None:
    """A translated line (bare event or envelope) as its event dict, or None."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict:
        return None
    inner = obj.get("event")
    if "schema_version" in obj and type(inner) is dict:
        return inner
    return obj


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
    token total, :func:`memfs.ingest.codex.turn_signature`), or None (a failed turn's message
    names no one turn)."""
    from memfs.ingest.codex import turn_signature

    sig = turn_signature(event)
    return sig if sig and sig[0] == "completed" and any(sig[1:]) else None


def failed_message(event: dict) -> str:
    """A ``turn.failed``'s message, as :func:`memfs.ingest.codex.turn_signature` reads it."""
    from memfs.ingest.codex import turn_signature

    return turn_signature(event)[1]


class KnownIds:
    """The agent ids a session holds, each with the number of the turn holding it (an id
    outside turns counts with the next turn), from its log via ``index/agent-ids``."""

    def __init__(self, handle, *, write: bool = True):
        self.handle = handle
        self.write = write and not handle.read_only
        self.items: dict[str, float] = {}
        self.turn_ids: dict[str, float] = {}
        self.threads: dict[str, float] = {}
        self.signatures: dict[tuple, float] = {}
        self.failed: dict[str, list] = {}  # a failed turn's message -> the turns it closed, in order
        self.exits: set[str] = set()  # ids of commands stored with their exit code
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

    def _load(self) -> None:
        self.items, self.turn_ids, self.threads, self.signatures, self.turns = {}, {}, {}, {}, {}
        self.failed, self.exits = {}, set()
        self.cur, self.in_turn, self.covered = 0, False, 0
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
            self.items, self.turn_ids, self.threads, self.signatures, self.turns = {}, {}, {}, {}, {}
            self.failed, self.exits = {}, set()
            self.cur, self.in_turn, self.covered = 0, False, 0
            if self.write:
                self._write(b"", rewrite=True)

    def _write(self, data: bytes, rewrite: bool = False) -> None:
        path = self.handle.path / AGENT_IDS
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
        starts: dict | None = None  # turn numbers by start offset, read once a turn starts
        recs: list = []
        covered = self.covered
        for off, line in self.handle.iter_lines(self.covered):
            covered = off + len(line) + 1
            decoded = decode_stored(line)
            if decoded is None:
                continue
            event = decoded[1]
            etype = event.get("type")
            if etype == "turn.started":
                if starts is None:
                    starts = {e["start_offset"]: e["turn_number"] for e in self.handle.turn_index
                              if e["start_offset"] >= off}
                n = starts.get(off, self.cur + 1)
                ctx = event.get("context") if type(event.get("context")) is dict else {}
                rec = ["T", n, 1 if _str(ctx.get("prompt")) else 0]
                self._apply(rec)
                recs.append(rec)
                tid = _str(ctx.get("turn_id"))
                if tid:
                    recs.append(["K", n, tid])
                    self._apply(recs[-1])
            elif etype in _CLOSES:
                if self.in_turn:
                    if _has_usage(event.get("usage")):
                        recs.append(["U", self.cur])
                        self._apply(recs[-1])
                    sig = signature(event)
                    if sig:
                        recs.append(["S", self.cur, list(sig)])
                        self._apply(recs[-1])
                    elif etype == "turn.failed":
                        recs.append(["F", self.cur, failed_message(event)])
                        self._apply(recs[-1])
                    recs.append(["C"])
                    self._apply(recs[-1])
            elif etype in _ITEMS:
                iid = _item_id(event)
                if iid and self.items.get(iid, OWN) == OWN:  # (an item's later events add nothing)
                    recs.append(["I", self.cur if self.in_turn else self.cur + 1, iid])
                    self._apply(recs[-1])
                if iid and iid not in self.exits and _exit_code(event) is not None:
                    recs.append(["X", iid])
                    self._apply(recs[-1])
            elif etype == "thread.started":
                tid = _str(event.get("thread_id"))
                if tid:
                    recs.append(["H", self.cur if self.in_turn else self.cur + 1, tid])
                    self._apply(recs[-1])
        touched = {r[1] for r in recs if (len(r) > 2 or r[0] == "U") and r[1] >= floor}
        if covered == self.covered:
            return touched
        self.covered = covered
        if self.write:
            recs.append(["@", covered])
            self._write(b"".join(orjson.dumps(r) + b"\n" for r in recs))
        return touched
