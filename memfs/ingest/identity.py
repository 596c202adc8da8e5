"""One session per agent conversation, each thing in it once (SPEC §10 "Identity").

**Which session** holds a conversation: :mod:`memfs.ingest.conversations`.

**Each thing once** (:class:`Dedupe`). Before a capture's translated events are appended,
what the session already holds of the conversation is dropped, by the agent's own ids (the
translators derive item ids and ``turn.started.context.turn_id`` from them):

* a turn whose ``turn_id`` is known, or whose first item with an id is known, is dropped
  whole (``turn.started`` and id-less events are held until that item — the turn's head
  only, so ``record`` still appends as lines arrive; at the end of a run an undecided head is
  kept). What the dropped turn adds to the stored one — its prompt, its ``turn_id``, its
  token counts, when the stored turn lacks them — goes to ``about.json`` ``turn_notes`` (by the
  stored turn's number), never into the log. A ``thread.completed`` right after it goes too;
* an item event whose id is known is dropped; a ``thread.started`` of a known thread too;
* a Codex turn no id decides (``exec --json`` has none) is matched at its close, by its
  signature (the thread's running token total; completed turns only);
* everything else — a resumed conversation's new turns — is appended.

"Known" means in a turn of the session that this capture did not append (the capture keeps
the numbers of the turns it appended in its state): a capture's own item lifecycle
(``item.started`` … ``item.completed`` of one id) is never a duplicate, however its lines are
batched, and neither is an id a writer uses again in a later turn; what another capture
appended meanwhile (``record`` while ``import --follow`` runs) is. Codex ``exec --json`` ids
(``item_0`` …, numbered per run) are not identities and never match.

The known ids come from the log (item ids, turn ids, thread ids, with the turn that holds
them), kept in ``index/agent-ids`` (one JSON array a line, appended as the log grows, with
``["@", length]`` marks of how much of the log it covers): it is caught up from the log when
the log grew past it and rebuilt when it is missing, torn, or names another log file (its
inode and first retained turn: a cap rewrite replaces the log) — the log is the truth.

**Metadata** (:class:`Capture`): after each batch the runner merges the translator's ``meta``
into ``about.json`` (:func:`memfs.store.about.merge`), with ``project`` (:func:`project_of`:
the git top-level of ``cwd`` when that is a work tree here, else ``cwd``) and what the runner
knows (the agent, a sub-agent's parent).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import orjson

from memfs.agents import agent_name, run_local_id
from memfs.events import decode_stored
from memfs.ingest.conversations import project_of, register
from memfs.store import about
from memfs.store.catalog import is_session_dir
from memfs.store.paths import EVENTS, INDEX_DIR, atomic_write, ensure_private_dir, open_nofollow

AGENT_IDS = "index/agent-ids"

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


def _has_usage(usage) -> bool:
    return type(usage) is dict and any(type(v) is int and v > 0 for v in usage.values())


def signature(event: dict) -> tuple | None:
    """A completed turn's close as Codex identifies it across captures (the thread's running
    token total, :func:`memfs.ingest.codex.turn_signature`), or None (a failed turn's message
    names no one turn)."""
    from memfs.ingest.codex import turn_signature

    sig = turn_signature(event)
    return sig if sig and sig[0] == "completed" and any(sig[1:]) else None


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
        elif tag == "I":
            if self.items.get(rec[2], OWN) == OWN:
                self.items[rec[2]] = rec[1]
        elif tag == "H":
            if self.threads.get(rec[2], OWN) == OWN:
                self.threads[rec[2]] = rec[1]

    def _load(self) -> None:
        self.items, self.turn_ids, self.threads, self.signatures, self.turns = {}, {}, {}, {}, {}
        self.cur, self.in_turn, self.covered = 0, False, 0
        self.ino = self._log_id()
        try:
            data = (self.handle.path / AGENT_IDS).read_bytes()
        except OSError:
            data = b""
        lines = data.split(b"\n")
        ok = bool(data) and data.endswith(b"\n")
        if ok:
            try:
                head = orjson.loads(lines[0])
                ok = head == ["memfs-agent-ids", 1, *self.ino]
            except orjson.JSONDecodeError:
                ok = False
        if ok:
            pending: list = []
            try:
                for line in lines[1:-1]:
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
            self.cur, self.in_turn, self.covered = 0, False, 0
            if self.write:
                self._write(b"", rewrite=True)

    def _write(self, data: bytes, rewrite: bool = False) -> None:
        path = self.handle.path / AGENT_IDS
        try:
            if rewrite:
                ensure_private_dir(self.handle.path / INDEX_DIR)
                atomic_write(path, orjson.dumps(["memfs-agent-ids", 1, *self.ino]) + b"\n" + data)
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
                    recs.append(["C"])
                    self._apply(recs[-1])
            elif etype in _ITEMS:
                iid = _item_id(event)
                if iid and self.items.get(iid, OWN) == OWN:  # (an item's later events add nothing)
                    recs.append(["I", self.cur if self.in_turn else self.cur + 1, iid])
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


# --- dedupe -------------------------------------------------------------------------------------

OUT, HEAD, HOLD, KEEP, DROP, AFTER = "out", "head", "hold", "keep", "drop", "after"


class Dedupe:
    """Filters one capture's translated lines against the session's :class:`KnownIds`.

    ``live`` (``record``): a turn is decided at its first item at the latest, so lines are
    appended as they arrive. Otherwise, for a Codex capture (``codex``) while the session
    holds turns known only by their close (``exec --json`` turns: no agent ids), a turn no id
    decided is held to its close and dropped when its signature
    (:func:`memfs.ingest.codex.turn_signature`: the thread's running token total) is one
    of theirs.
    """

    def __init__(self, known: KnownIds, state: dict | None = None, *, live: bool = False):
        self.known = known
        self.live = live
        self.codex = False
        state = state or {}
        self.mode = state.get("mode", OUT)
        self.match = state.get("match")  # the stored turn a dropped turn repeats
        self.own = {n for n in state.get("own") or () if type(n) is int}  # turns this capture appended
        self.head: list[bytes] = []
        self.head_ctx: dict = {}
        self.holds: bool | None = None
        self.notes: dict[str, dict] = {}  # turn number -> what a dropped turn added
        self.dropped = 0

    def state(self) -> dict:
        return {"mode": self.mode, "match": self.match, "own": sorted(self.own)}

    def _foreign(self, table: dict, key) -> float | None:
        """The number of the turn holding ``key``, when another capture appended it."""
        if key is None:
            return None
        n = table.get(key)
        return n if n is not None and n != OWN and n not in self.own else None

    def _note(self, n, field: str, value, has_index: int) -> None:
        flags = self.known.turns.get(n)
        if value in (None, "", {}) or flags is None or flags[has_index]:
            return
        self.notes.setdefault(str(n), {}).setdefault(field, value)

    def _drop_turn(self, n) -> None:
        self.mode, self.match = DROP, n
        self.dropped += len(self.head)
        self.head = []
        self._note(n, "prompt", _str(self.head_ctx.get("prompt")), 0)
        self._note(n, "turn_id", _str(self.head_ctx.get("turn_id")), 2)

    def _keep_head(self, out: list) -> None:
        if self.mode in (HEAD, HOLD):
            out.extend(self.head)
            self.head = []
            self.mode = KEEP

    def _hold(self) -> bool:
        """Whether an undecided turn waits for its close (see the class docstring)."""
        if self.holds is None:  # (once a call of feed)
            self.holds = self.codex and not self.live and any(
                n != OWN and n not in self.own for n in self.known.signatures.values())
        return self.holds

    def _close(self, raw: bytes, event: dict, out: list) -> None:
        if self.mode in (HEAD, HOLD) and self.codex:
            n = self._foreign(self.known.signatures, signature(event))
            if n is not None:
                self._drop_turn(n)
        if self.mode == DROP:
            usage = event.get("usage")
            self._note(self.match, "usage", usage if _has_usage(usage) else None, 1)
            self.mode = AFTER
            self.dropped += 1
            return
        self._keep_head(out)
        out.append(raw)
        self.mode = OUT

    def feed(self, lines: list[bytes]) -> list[bytes]:
        """The lines to append, in order (a turn's head may be held for the next call)."""
        out: list[bytes] = []
        self.holds = None
        for raw in lines:
            event = _event_of(raw)
            etype = event.get("type") if event is not None else None
            if etype == "turn.started":
                self._keep_head(out)
                ctx = event.get("context") if type(event.get("context")) is dict else {}
                self.head, self.head_ctx = [raw], ctx
                self.mode = HEAD
                n = self._foreign(self.known.turn_ids, _str(ctx.get("turn_id")))
                if n is not None:
                    self._drop_turn(n)
                continue
            if etype in _CLOSES:
                self._close(raw, event, out)
                continue
            item = event.get("item") if etype in _ITEMS else None
            if type(item) is dict and _str(item.get("id")):
                iid = _item_id(event)  # None for an id that names nothing beyond its run
                if self.mode in (HEAD, HOLD):
                    n = self._foreign(self.known.items, iid)
                    if n is not None:
                        self._drop_turn(n)
                        self.dropped += 1
                        continue
                    if self.mode == HEAD and self._hold():
                        self.mode = HOLD
                    if self.mode == HOLD:
                        self.head.append(raw)
                        if iid:
                            self.known.items.setdefault(iid, OWN)
                        continue
                    self._keep_head(out)
                elif self.mode == DROP:
                    self.dropped += 1
                    continue
                else:
                    if self.mode == AFTER:
                        self.mode = OUT
                    if self._foreign(self.known.items, iid) is not None:
                        self.dropped += 1
                        continue
                if iid:
                    self.known.items.setdefault(iid, OWN)
                out.append(raw)
                continue
            if self.mode in (HEAD, HOLD):
                self.head.append(raw)
                continue
            if self.mode == DROP:
                self.dropped += 1
                continue
            if self.mode == AFTER:
                if etype == "thread.completed":
                    self.dropped += 1
                    continue
                self.mode = OUT
            if etype == "thread.started":
                tid = _str(event.get("thread_id"))
                if self._foreign(self.known.threads, tid) is not None:
                    self.dropped += 1
                    continue
                if tid:
                    self.known.threads.setdefault(tid, OWN)
            out.append(raw)
        return out

    def finish(self) -> list[bytes]:
        """At the end of a run: a turn still undecided is kept."""
        out: list[bytes] = []
        self._keep_head(out)
        return out

    def take_notes(self) -> dict:
        notes, self.notes = self.notes, {}
        return notes


# --- one capture --------------------------------------------------------------------------------


class Capture:
    """What a runner (import, follow, record) keeps for one capture of a conversation: its
    :class:`Dedupe` and the metadata it merges into ``about.json``.

    ``agent``: the agent the runner knows (from the format, or the command's name), merged
    when the record does not say; ``conversation_id``: the id the runner placed the capture
    by; ``extra``: fields the runner sets over the record's (a sub-agent's ``parent_session``
    and ``conversation_id``); ``parent``: the directory name of the session whose
    ``children`` get this one.
    """

    def __init__(self, root: Path, *, agent: str | None = None, conversation_id: str | None = None,
                 extra: dict | None = None, parent: str | None = None, state: dict | None = None,
                 live: bool = False):
        self.root = Path(root)
        self.live = live
        self.session_agent: str | None = None
        self.agent = agent
        self.conversation_id = conversation_id
        self.extra = dict(extra or {})
        self.parent = parent
        self.saved = state or {}
        self.known: KnownIds | None = None
        self.dedupe: Dedupe | None = None
        self.registered: str | None = None
        self.told_parent = False

    def attach(self, handle) -> None:
        """Start deduping against ``handle``'s session (read-only handles: no index written)."""
        self.known = KnownIds(handle)
        self.known.refresh()
        self.dedupe = Dedupe(self.known, self.saved, live=self.live)
        self.session_agent = about.read(handle.path).get("agent")

    def filter(self, lines: list[bytes], record_meta: dict | None = None) -> list[bytes]:
        """``lines`` less what the session holds (call :meth:`appended` after appending);
        ``record_meta``: the translator's, so far."""
        self.known.refresh()
        agent = (record_meta or {}).get("agent") or self.agent or self.session_agent
        self.dedupe.codex = isinstance(agent, str) and agent_name(agent) == "codex"
        return self.dedupe.feed(lines)

    def appended(self) -> None:
        """The lines just appended are this capture's (the caller appended them as the
        session's writer, right after :meth:`filter`)."""
        self.dedupe.own |= self.known.refresh()

    def finish(self) -> list[bytes]:
        return self.dedupe.finish() if self.dedupe is not None else []

    @property
    def dropped(self) -> int:
        return self.dedupe.dropped if self.dedupe is not None else 0

    def state(self) -> dict:
        return self.dedupe.state() if self.dedupe is not None else dict(self.saved)

    def meta(self, record_meta: dict | None) -> dict:
        """What to merge: the runner's agent, then the record's meta, then the runner's
        fields; ``project`` from ``cwd``."""
        meta: dict = {}
        if self.agent:
            meta["agent"] = self.agent
        if self.conversation_id:
            meta["conversation_id"] = self.conversation_id
        meta.update((k, v) for k, v in (record_meta or {}).items() if v is not None)
        meta.update(self.extra)
        if isinstance(meta.get("agent"), str):
            meta["agent"] = agent_name(meta["agent"])
        if not meta.get("conversation_id") and self.known is not None:
            own = [t for t, n in self.known.threads.items() if n == OWN or n in self.dedupe.own]
            if own:
                meta["conversation_id"] = own[0]
        cwd = meta.get("cwd")
        if isinstance(cwd, str) and cwd and not meta.get("project"):
            meta["project"] = project_of(cwd)
        return meta

    def after(self, handle, record_meta: dict | None) -> None:
        """After a batch was appended: merge the metadata, note the conversation in the map and
        the child in its parent (the caller holds ``handle``'s session as its writer)."""
        meta = self.meta(record_meta)
        if self.dedupe is not None:
            notes = self.dedupe.take_notes()
            if notes:
                meta["turn_notes"] = notes
        merged = about.merge(handle.path, meta)
        cid = merged.get("conversation_id")
        if isinstance(cid, str) and cid and self.registered != cid:
            register(self.root, cid, merged.get("agent"), handle.name)
            self.registered = cid
        if self.parent and not self.told_parent:
            parent_dir = self.root / self.parent
            if is_session_dir(parent_dir):
                about.merge(parent_dir, {"children": [handle.name]})
                self.told_parent = True
