"""``memfs fork``: a new session from the first turns of another (SPEC §11).

:func:`fork_session` copies the source's log from its first byte to the end of turn ``N``
(its ordinal as the manifest and ``index/turns.json`` number turns; every line by default),
verbatim, through the store's commit path, into a new session; the source is only read (a
read-only open: no lock, nothing written). Lines after turn ``N``'s last line — a
``thread.completed``, records between turns — are not copied.

Decisions recorded here:

* ``N`` may name the open turn (``turn_count + 1`` while the source is in a turn): its lines
  so far are copied and the fork ends inside that open turn too, as the source did when it was
  forked (the next ``turn.started`` appended to the fork closes it as abandoned, §3.1).
* Turns the source evicted cannot be forked at (``N`` below ``retained_turn_base``); a source
  with evicted turns gives a fork whose turns are numbered from 1.
* The fork is written with no event cap (its lines are already within the source's), and
  ``index/about.json`` gets the source's metadata (agent, project, title, model …) less what
  belongs to the source's conversation alone (``conversation_id``, ``children``,
  ``parent_session``, ``status``, ``ended_at``, ``pr_link``), the source's ``turn_notes`` for the
  copied turns (renumbered as the fork numbers them) and ``item_notes``, plus ``forked_from``
  (the source's directory name) and ``forked_at_turn`` (``N`` in the source's numbering, or the
  last copied turn; absent when the source had no turn).
* A fork is its own conversation (SPEC §11): its ``conversation_id`` is a fresh random UUID
  (:attr:`Forked.conversation_id`), never the source's, so its export and resume write a file of
  its own and an import of that file lands in the fork, never in the source. The copied
  ``thread.started`` lines still name the source's thread; the export reads the fork's id from
  ``about.json`` (:mod:`memfs.export.conversation`). The caller notes the new id in the
  conversation map (``memfs fork`` does: :func:`memfs.ingest.conversations.register`; the map is
  an ingest cache this floor does not reach).
* A fork that fails half-way is removed whole: the new name exists only once the fork is done.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from memfs.errors import AlreadyExists, TurnNotFound
from memfs.store import about
from memfs.store.batch import append_batch
from memfs.store.paths import new_session_name_error, remove_tree
from memfs.store.session import open_session

BATCH_BYTES = 8 << 20  # lines appended at a time
NOT_INHERITED = frozenset({"conversation_id", "children", "parent_session", "status", "ended_at", "pr_link",
                           "forked_from", "forked_at_turn", "turn_notes"})


@dataclass
class Forked:
    """What :func:`fork_session` made: the new session's ``name``, its ``source``, the
    source's last copied turn ``at_turn`` (None: no turn), ``turns`` copied, whether the last
    is still ``open``, the ``lines`` appended and ``refused`` (the store refused them: they are
    in the fork's ``rejected.jsonl``), the fork's own ``conversation_id`` and its ``agent``
    (None when the source names none)."""

    name: str
    source: str
    at_turn: int | None
    turns: int
    open: bool
    lines: int
    refused: int
    conversation_id: str = ""
    agent: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def fork_session(root: str | os.PathLike, source: str, new: str, *, at_turn: int | None = None,
                 durability: str = "write") -> Forked:
    """Make session ``new`` from the first ``at_turn`` turns of ``source`` (all of its log when
    None); see the module docstring. Refused with a one-line reason: ``new`` not a valid
    ``mkdir`` name (:class:`~memfs.errors.InvalidName`) or existing
    (:class:`~memfs.errors.AlreadyExists`), ``source`` missing (:class:`FileNotFoundError`),
    ``at_turn`` not one of its retained turns (:class:`~memfs.errors.TurnNotFound`)."""
    root = Path(root)
    error = new_session_name_error(new)
    if error is not None:
        raise error
    with open_session(root, source, read_only=True) as src:
        if src.path == root / new:
            raise AlreadyExists(f"session {new!r} already exists (it is the source)")
        if os.path.lexists(root / new):
            raise AlreadyExists(f"session {new!r} already exists")
        with src.reads.hold():  # the turn's range and the bytes from one version of the log
            m = src.manifest
            base, last = m["retained_turn_base"], m["turn_count"] + (1 if m["in_turn"] else 0)
            if at_turn is None:
                end, upto = None, (last if last >= base else None)
            else:
                if not base <= at_turn <= last:
                    have = f"turns {base}..{last}" if last >= base else "no turns"
                    raise TurnNotFound(f"turn {at_turn} is out of range: session {src.name!r} has {have}"
                                       + (f" (turns before {base} were evicted)" if base > 1 else ""))
                end, upto = src.turn_range(at_turn)[1], at_turn
            is_open = upto is not None and m["in_turn"] and upto == last
            lines = src.iter_lines(0, end)  # (its own descriptor: this version of the log)
        meta = _inherited(about.read(src.path), src.name, base, upto)
        forked = Forked(new, src.name, upto, 0 if upto is None else upto - base + 1, is_open, 0, 0,
                        meta["conversation_id"], meta["agent"] if isinstance(meta.get("agent"), str) else None)
        _write(root, new, lines, forked, durability, meta)
    return forked


def _write(root: Path, new: str, lines, forked: Forked, durability: str, meta: dict) -> None:
    path = root / new
    try:
        os.mkdir(path, 0o700)  # (atomic: a concurrent fork or mkdir of the same name loses here)
    except FileExistsError:
        lines.close()
        raise AlreadyExists(f"session {new!r} already exists") from None
    try:
        with open_session(root, new, durability=durability, max_events=0) as dst:
            about.merge(path, meta)  # (first: the fork is never seen without forked_from)
            batch: list[bytes] = []
            size = 0
            for _offset, line in lines:
                batch.append(line)
                size += len(line)
                if size >= BATCH_BYTES:
                    _append(dst, batch, forked)
                    batch, size = [], 0
            _append(dst, batch, forked)
            dst.flush()
    except BaseException:
        remove_tree(path)
        raise
    finally:
        lines.close()


def _append(dst, batch: list[bytes], forked: Forked) -> None:
    if batch:
        result = append_batch(dst, batch)
        forked.lines += result.accepted
        forked.refused += len(result.refused)


def _inherited(meta: dict, source: str, base: int, upto: int | None) -> dict:
    """The fork's ``about.json``: see the module docstring."""
    out = {k: v for k, v in meta.items() if k not in NOT_INHERITED}
    notes = meta.get("turn_notes")
    if isinstance(notes, dict) and upto is not None:
        shifted = {str(int(n) - base + 1): note for n, note in notes.items()
                   if isinstance(n, str) and n.isdigit() and base <= int(n) <= upto}
        if shifted:
            out["turn_notes"] = shifted
    out["forked_from"] = source
    out["forked_at_turn"] = upto
    out["conversation_id"] = str(uuid.uuid4())  # its own conversation (module docstring)
    return out
