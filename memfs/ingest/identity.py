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
  stored turn's number), never into the log; an import's (not ``record``'s) close that names its
  requests (a file's: a stream close naming none, as Codex's and Gemini's, may count the whole
  thread or add other requests) notes its usage, requests and times as ``final``, which the usage view takes over the stored turn's (the file is the
  agent's final record: a stream's counts may be placeholders or add a sub-agent's); a dropped command's exit code and status, when
  the stored command has none, to ``item_notes`` (by the item id). A ``thread.completed``
  right after it goes too, unless the stored turn is the log's last and no run's end follows
  it (a stream without one, a capture killed before its end): then it is appended. A
  ``turn_id`` noted so is known as the stored turn's;
* an item event whose id is known is dropped; a ``thread.started`` of a known thread too;
* a Codex turn no id decides (``exec --json`` has none) is matched at its close, by its
  signature (the thread's running token total) when it completed; when it failed, with a
  stored failed turn of the other capture kind (a rollout's turn has a ``turn_id``, an
  ``exec --json`` turn none) with the same message that no capture paired yet — one to one,
  in turn order; the pairing is noted (``turn_notes`` ``paired``) so a later import does not
  pair that turn again. An OpenCode failed turn with no item (its stream and its store share
  no id for it) is paired so too;
* everything else — a resumed conversation's new turns — is appended.

"Known" means in a turn of the session that this capture did not append (the capture keeps
the numbers of the turns it appended in its state): a capture's own item lifecycle
(``item.started`` … ``item.completed`` of one id) is never a duplicate, however its lines are
batched, and neither is an id a writer uses again in a later turn; what another capture
appended meanwhile (``record`` while ``import --follow`` runs) is. Codex ``exec --json`` ids
(``item_0`` …, numbered per run) are not identities and never match.

The known ids come from the log, through ``index/agent-ids`` (:mod:`memfs.ingest.agent_ids`).

**Metadata** (:class:`Capture`): after each batch the runner merges the translator's ``meta``
into ``about.json`` (:func:`memfs.store.about.merge`), with ``project`` (:func:`project_of`:
the git top-level of ``cwd`` when that is a work tree here, else ``cwd``) and what the runner
knows (the agent, a sub-agent's parent).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from memfs import agents
from memfs.agents import agent_name
from memfs.ingest.agent_ids import (
    _CLOSES,
    _ITEMS,
    OWN,
    KnownIds,
    _event_of,
    _exit_code,
    _has_usage,
    _item_id,
    _str,
    facts,
    failed_message,
    line_event,
    signature,
)
from memfs.ingest.conversations import project_of, register
from memfs.store import about
from memfs.store.sessiondirs import is_session_dir

# --- dedupe -------------------------------------------------------------------------------------

OUT, HEAD, HOLD, KEEP, DROP, AFTER = "out", "head", "hold", "keep", "drop", "after"


class Dedupe:
    """Filters one capture's translated lines against the session's :class:`KnownIds`.

    ``live`` (``record``): a turn is decided at its first item at the latest, so lines are
    appended as they arrive. Otherwise, for a Codex capture (``codex``) while the session
    holds turns known only by their close (``exec --json`` turns: no agent ids), a turn no id
    decided is held to its close and dropped when its signature
    (:func:`memfs.agents.codex.shapes.turn_signature`: the thread's running token total) is one
    of theirs, or when it failed and pairs with a stored failed turn (module docstring).
    ``notes()``: the session's ``turn_notes`` as they are now (the turn ids noted for stored
    turns, which stored turns another capture paired), read at most once a :meth:`feed`.
    """

    def __init__(self, known: KnownIds, state: dict | None = None, *, live: bool = False,
                 notes: Callable[[], dict] | None = None):
        self.known = known
        self.live = live
        self.codex = False
        self.pairs_failed = False  # (OpenCode: its stream and its store, a failed turn with no item)
        self.read_notes = notes or dict
        state = state or {}
        self.mode = state.get("mode", OUT)
        self.match = state.get("match")  # the stored turn a dropped turn repeats
        self.own = {n for n in state.get("own") or () if type(n) is int}  # turns this capture appended
        self.paired = {n for n in state.get("paired") or () if type(n) is int}  # failed turns it paired
        self.head: list[bytes] = []
        self.decoded: dict[int, tuple] = {}  # id(raw) -> (raw, facts, wrap) of the lines held in head
        self.out: list[tuple] = []  # (raw, facts, wrap) of the lines the last feed or finish returned
        self.head_ctx: dict = {}
        self.holds: bool | None = None
        self.session_notes: dict | None = None  # notes() as of this feed call
        self.noted_ids: dict | None = None  # turn id -> the stored turn a note gives it to
        self.notes: dict[str, dict] = {}  # turn number -> what a dropped turn added
        self.item_notes: dict[str, dict] = {}  # item id -> a dropped command's result
        self.dropped = 0

    def state(self) -> dict:
        return {"mode": self.mode, "match": self.match, "own": sorted(self.own), "paired": sorted(self.paired)}

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

    def _note_item(self, iid: str | None, event: dict | None) -> None:
        """A dropped item event: its command's exit code and status, when the stored command
        (another capture's) has none."""
        code = _exit_code(event) if event is not None else None
        if code is None or iid is None or iid in self.known.exits or self._foreign(self.known.items, iid) is None:
            return
        status = event["item"].get("status")
        self.item_notes.setdefault(iid, {"exit_code": code, **({"status": status} if type(status) is str else {})})

    def _drop_turn(self, n) -> None:
        self.mode, self.match = DROP, n
        self.dropped += len(self.head)
        for raw in self.head:
            if b'"command_execution"' in raw:
                event = _event_of(raw)
                self._note_item(_item_id(event) if event is not None else None, event)
        self.head = []
        self._note(n, "prompt", _str(self.head_ctx.get("prompt")), 0)
        self._note(n, "turn_id", _str(self.head_ctx.get("turn_id")), 2)
        if self.noted_ids is not None and _str(self.notes.get(str(n), {}).get("turn_id")):
            self.noted_ids.setdefault(self.notes[str(n)]["turn_id"], n)

    def _final(self, event: dict, usage: dict) -> dict:
        """What a dropped close from an agent's file says of the stored turn: its usage, its
        requests, its model and the turn's record times (those it has)."""
        final: dict = {"usage": usage}
        if type(event.get("requests")) is list:
            final["requests"] = event["requests"]
        if type(event.get("model")) is str and event["model"]:  # (Codex exec --json names none)
            final["model"] = event["model"]
        for key, value in (("started_at", self.head_ctx.get("timestamp")), ("completed_at", event.get("completed_at"))):
            if type(value) is str:
                final[key] = value
        return final

    def _keep_head(self, out: list) -> None:
        if self.mode in (HEAD, HOLD):
            out.extend(self.head)
            self.head = []
            self.mode = KEEP

    def _hold(self) -> bool:
        """Whether an undecided turn waits for its close (see the class docstring)."""
        if self.holds is None:  # (once a call of feed)
            closes = [*self.known.signatures.values(), *(n for ns in self.known.failed.values() for n in ns)]
            self.holds = self.codex and not self.live and any(n != OWN and n not in self.own for n in closes)
        return self.holds

    def _session_notes(self) -> dict:
        if self.session_notes is None:
            notes = self.read_notes()
            self.session_notes = notes if type(notes) is dict else {}
        return self.session_notes

    def _noted_turn(self, tid: str | None) -> int | None:
        """The stored turn (another capture's) whose ``turn_notes`` give it ``tid``."""
        if tid is None:
            return None
        if self.noted_ids is None:
            self.noted_ids = {}
            for notes in (self._session_notes(), self.notes):
                for key, note in notes.items():
                    noted = note.get("turn_id") if type(note) is dict else None
                    if type(noted) is str and type(key) is str and key.isdigit():
                        self.noted_ids.setdefault(noted, int(key))
        n = self.noted_ids.get(tid)
        return n if n is not None and n in self.known.turns and n not in self.own else None

    def _pair_failed(self, event: dict) -> int | None:
        """The stored failed turn a failed close repeats (module docstring), or None."""
        has_id = bool(_str(self.head_ctx.get("turn_id")))
        for n in self.known.failed.get(failed_message(event), ()):
            flags = self.known.turns.get(n)
            if n == OWN or n in self.own or n in self.paired or flags is None or flags[2] == has_id:
                continue
            note = self._session_notes().get(str(n))
            if type(note) is dict and note.get("paired"):
                continue
            self.paired.add(n)
            self.notes.setdefault(str(n), {})["paired"] = True
            return n
        return None

    def _close(self, raw: bytes, event: dict, out: list) -> None:
        if self.mode in (HEAD, HOLD) and (self.codex or self.pairs_failed):
            n = self._foreign(self.known.signatures, signature(event)) if self.codex else None
            if n is None and event.get("type") == "turn.failed":
                n = self._pair_failed(event)
            if n is not None:
                self._drop_turn(n)
        if self.mode == DROP:
            usage = event.get("usage")
            self._note(self.match, "usage", usage if _has_usage(usage) else None, 1)
            if not self.live and _has_usage(usage) and type(event.get("requests")) is list \
                    and self.known.turns.get(self.match) is not None:
                # an import's close is the agent's final record of the turn (a stream's counts
                # may be early placeholders, or add a sub-agent's): its usage is the turn's
                self.notes.setdefault(str(self.match), {}).setdefault("final", self._final(event, usage))
            self.mode = AFTER
            self.dropped += 1
            return
        self._keep_head(out)
        out.append(raw)
        self.mode = OUT

    def feed(self, lines: list[bytes]) -> list[bytes]:
        """The lines to append, in order (a turn's head may be held for the next call)."""
        out: list[bytes] = []
        self.holds = self.session_notes = self.noted_ids = None
        decoded = self.decoded
        for raw in lines:
            event, wrap = line_event(raw)
            decoded[id(raw)] = (raw, facts(event) if event is not None else None, wrap)
            etype = event.get("type") if event is not None else None
            if etype == "turn.started":
                self._keep_head(out)
                ctx = event.get("context") if type(event.get("context")) is dict else {}
                self.head, self.head_ctx = [raw], ctx
                self.mode = HEAD
                tid = _str(ctx.get("turn_id"))
                n = self._foreign(self.known.turn_ids, tid)
                if n is None and tid is not None:
                    n = self._noted_turn(tid)
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
                        self._note_item(iid, event)
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
                    self._note_item(iid, event)
                    continue
                else:
                    if self.mode == AFTER:
                        self.mode = OUT
                    if self._foreign(self.known.items, iid) is not None:
                        self.dropped += 1
                        self._note_item(iid, event)
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
                if etype == "thread.completed" and (self.match in self.known.ended or self.match != self.known.cur):
                    self.dropped += 1  # (the stored turn's run has its end, or later turns follow it)
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
        return self._decoded(out)

    def _decoded(self, out: list[bytes]) -> list[bytes]:
        """``out``, its lines' decodings kept in :attr:`out` (those held in head kept for later)."""
        decoded = self.decoded
        self.out = [decoded[id(raw)] for raw in out]
        self.decoded = {id(raw): decoded[id(raw)] for raw in self.head}
        return out

    def finish(self) -> list[bytes]:
        """At the end of a run: a turn still undecided is kept."""
        out: list[bytes] = []
        self._keep_head(out)
        return self._decoded(out)

    def take_notes(self) -> tuple[dict, dict]:
        """The ``turn_notes`` and ``item_notes`` gathered since the last call."""
        notes, self.notes = self.notes, {}
        items, self.item_notes = self.item_notes, {}
        return notes, items


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
        self.mark: tuple[int, int] | None = None  # KnownIds.mark() before the lines last returned
        self.dedupe: Dedupe | None = None
        self.registered: str | None = None
        self.told_parent = False

    def attach(self, handle) -> None:
        """Start deduping against ``handle``'s session (read-only handles: no index written)."""
        self.known = KnownIds(handle)
        self.known.refresh()
        path = handle.path
        self.dedupe = Dedupe(self.known, self.saved, live=self.live,
                             notes=lambda: about.read(path).get("turn_notes") or {})
        self.session_agent = about.read(handle.path).get("agent")

    def filter(self, lines: list[bytes], record_meta: dict | None = None) -> list[bytes]:
        """``lines`` less what the session holds (call :meth:`appended` after appending);
        ``record_meta``: the translator's, so far."""
        self.known.refresh()
        agent = (record_meta or {}).get("agent") or self.agent or self.session_agent
        table = agents.shapes(agent_name(agent)) if isinstance(agent, str) else None  # (its table's rules)
        self.dedupe.codex = table is not None and table.closes_by_signature
        self.dedupe.pairs_failed = table is not None and table.pairs_failed
        self.mark = self.known.mark()
        return self.dedupe.feed(lines)

    def appended(self, lines: list[bytes] | None = None, accepted: int = 0) -> None:
        """The lines just appended are this capture's (the caller appended them as the
        session's writer, right after :meth:`filter` or :meth:`finish`); ``lines``: what it
        appended, of which the store accepted ``accepted`` (lets the index take them from
        memory, :meth:`KnownIds.appended`)."""
        out, mark, self.mark = self.dedupe.out, self.mark, None
        if mark is None or lines is None or len(lines) != len(out) or any(a is not b[0] for a, b in zip(lines, out)):
            self.dedupe.own |= self.known.refresh()
        else:
            self.dedupe.own |= self.known.appended(mark, out, accepted)

    def finish(self) -> list[bytes]:
        if self.dedupe is None:
            return []
        self.mark = self.known.mark()
        return self.dedupe.finish()

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
            notes, items = self.dedupe.take_notes()
            if notes:
                meta["turn_notes"] = notes
            if items:
                meta["item_notes"] = items
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
