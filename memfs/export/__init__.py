"""Sessions out (SPEC §11): a session written in a tool's own format so that its CLI continues
it — :func:`export_session`.

Targets: ``claude`` (a Claude Code transcript, :mod:`memfs.agents.claude.write`), ``codex`` (a Codex
rollout, :mod:`memfs.agents.codex.write`), ``opencode`` (a file for ``opencode import``,
:mod:`memfs.agents.opencode.write`; it needs an ``out``), ``markdown`` (:func:`memfs.export.markdown.render`) and
``jsonl`` (the session's own log, byte for byte).

Where the file goes (``out``; docs/design.md "Export: where --out puts the file") is each
agent's writer's (its ``write.place``, giving a :class:`Placement`; the helpers :func:`store_dir`
and :func:`out_file` are theirs):

* ``None`` — ``claude``/``codex``: the CLI's own store under ``home`` (default: the user's:
  ``$CLAUDE_CONFIG_DIR`` or ``~/.claude``; ``$CODEX_HOME`` or ``~/.codex``), in the CLI's layout
  (``projects/<cwd slug>/<uuid>.jsonl``; ``sessions/YYYY/MM/DD/rollout-<time>-<uuid>.jsonl``).
  ``markdown``/``jsonl`` need an ``out``.
* a directory that is the CLI's store (named ``.claude``/``.codex``, or holding ``projects/``,
  resp. ``sessions/`` or ``config.toml``) or a HOME holding one (``DIR/.claude``,
  ``DIR/.codex``): placed in that store's layout;
* any other existing directory: the file under its CLI name (``<uuid>.jsonl``,
  ``rollout-…-<uuid>.jsonl``, ``<session>.md``, ``<session>.jsonl``) in it;
* anything else: that file (its directory must exist).

An existing file is never replaced: the export refuses with :class:`ExportExists` (which
carries the existing file's :class:`ExportResult`), and so does an export into a store that
already holds a conversation with that id under another name (the CLI would find either). A
session is written only under a conversation id that is its own: one the conversation map
gives to another session (a fork made before forks had ids of their own) is refused.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from memfs import agents
from memfs.errors import MemfsError
from memfs.export.conversation import Conversation, read_conversation
from memfs.store import about as about_store
from memfs.store.paths import fsync_dir, write_temp

TARGETS = (*agents.writers(), "markdown", "jsonl")  # the agents with a write.py (memfs.agents), then ours


@dataclass(frozen=True)
class ExportResult:
    """``path``: the file written; ``conversation_id``: the UUID the CLI resumes; ``argv``: the
    resume command line (run it in ``cwd``; empty for ``markdown``/``jsonl``)."""

    path: Path
    conversation_id: str
    argv: list[str] = field(default_factory=list)
    cwd: str = ""
    to: str = ""


@dataclass(frozen=True)
class Placement:
    """What an agent's writer writes for a session and where (its ``write.place(conv, out, home,
    cwd)``: the CLI's store layout is its writer's): ``data`` into ``path``; ``argv`` continues
    it; ``taken``: files of the target's store that hold the conversation already (then nothing
    is written); ``in_store``: ``path`` is in the CLI's store (its layout's directories are made)."""

    path: Path
    data: bytes
    conversation_id: str
    argv: list[str]
    taken: list[Path] = field(default_factory=list)
    in_store: bool = False


class ExportError(MemfsError):
    """An export refused (a bad target, an empty session, a missing directory)."""

    errno_name = "EINVAL"


class ExportExists(ExportError):
    """The file (or the conversation, in the target's store) exists: nothing was written.
    ``result`` names the existing file and how to resume it."""

    errno_name = "EEXIST"

    def __init__(self, reason: str, result: ExportResult) -> None:
        super().__init__(reason)
        self.result = result


def conversation_of(handle) -> Conversation:
    """The session behind ``handle`` (an open session, read-only is enough) as a conversation."""
    about = about_store.read(Path(handle.path))
    base = handle.manifest.get("retained_turn_base")
    return read_conversation(handle.name, (line for _, line in handle.iter_lines()), about, handle.turn_times(),
                             base if type(base) is int and base > 0 else 1)


def export_session(handle, to: str, out: Path | None = None, *, home: Path | None = None,
                   cwd: str | None = None) -> ExportResult:
    """Write the session behind ``handle`` for ``to`` (one of :data:`TARGETS`); see the module
    docstring for ``out`` and ``home``. ``cwd``: the directory the CLI will be run in (default:
    the session's recorded cwd when it is an absolute path without ``.``/``..`` or control
    characters — it need not exist here — else the current directory) — Claude Code looks for the
    transcript under that directory's slug. Raises :class:`ExportError` / :class:`ExportExists`."""
    if to not in TARGETS:
        raise ExportError(f"export: unknown target {to!r} (one of {', '.join(TARGETS)})")
    out = Path(out) if out is not None else None
    if to in ("markdown", "jsonl"):
        return _export_text(handle, to, out)
    conv = conversation_of(handle)
    if not conv.turns:
        raise ExportError(f"export: session {handle.name} has no turns to export")
    from memfs.export.resume import cwd_problem

    recorded = conv.about.get("cwd")  # (a relative or odd path read from a record: never a place to put or print)
    session_cwd = recorded if isinstance(recorded, str) and \
        cwd_problem(recorded) in (None, "it is not a directory here") else None
    where = cwd or session_cwd or os.getcwd()
    uid = conv.conversation_id
    _own_conversation(handle, conv, uid)
    writer = agents.writer(to)  # (TARGETS: the agents with a write.py)
    assert writer is not None
    placed: Placement = writer.place(conv, out, home, where)
    result = ExportResult(placed.path, placed.conversation_id, placed.argv, where, to)
    if placed.taken:
        existing, argv = placed.taken[0], placed.argv
        raise ExportExists(f"export: {existing} already holds conversation {uid}; "
                           f"`{' '.join(argv)}` continues it (nothing written)",
                           ExportResult(existing, uid, argv, _cwd_of(existing) or where, to))
    _write_new(placed.path, placed.data, result, make_parents=placed.in_store)
    return result


def _own_conversation(handle, conv: Conversation, uid: str) -> None:
    """Refuse to write a file under a conversation id another session holds (the conversation
    map, :func:`memfs.ingest.conversations.find_conversation`): the CLI would continue that
    session's conversation, and an import of the file would land there (SPEC §11: a fork is its
    own conversation)."""
    from memfs.ingest.conversations import find_conversation

    holder = find_conversation(Path(handle.path).parent, uid, write=False)
    if holder is None or holder == handle.name:
        return
    why = (f" ({handle.name} was forked from it before forks got conversation ids of their own: "
           f"fork {conv.about['forked_from']} again)") if conv.about.get("forked_from") else ""
    raise ExportError(f"export: conversation {uid} is session {holder}'s, not {handle.name}'s{why} (nothing written)")
def _export_text(handle, to: str, out: Path | None) -> ExportResult:
    if out is None:
        raise ExportError(f"export: --to {to} needs --out (a file or a directory)")
    if to == "markdown":
        try:
            from memfs.export.markdown import render
        except ImportError:
            raise ExportError("export: the Markdown export is not available in this build "
                              "(memfs.export.markdown.render is missing)") from None
        data = render(handle).encode()
        name = f"{handle.name}.md"
    else:
        data = handle.read_bytes(0)
        name = f"{handle.name}.jsonl"
    conv_id = about_store.read(Path(handle.path)).get("conversation_id")
    path = out_file(out, name)
    result = ExportResult(path=path, conversation_id=conv_id if isinstance(conv_id, str) else handle.name, to=to)
    _write_new(path, data, result, make_parents=False)
    return result


def store_dir(out: Path | None, home: Path | None, dirname: str, marks: tuple[str, ...],
              env: str | None) -> Path | None:
    """The CLI's store ``out`` names (None: ``out`` is a plain file or directory): with no
    ``out``, ``home/<dirname>``, else ``env``, else ``~/<dirname>``; ``out`` itself when it is
    named ``dirname`` or holds one of ``marks``; ``out/<dirname>`` when that is a directory."""
    if out is None:
        if home is not None:
            return Path(home) / dirname
        return Path(env) if env else Path.home() / dirname
    if out.name == dirname or (out.is_dir() and any((out / m).exists() for m in marks)):
        return out
    if (out / dirname).is_dir():
        return out / dirname
    return None


def jsonl(lines: Iterable[dict]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def out_file(out: Path | None, name: str) -> Path:
    """The file ``out`` names: ``out/<name>`` for a directory, else ``out`` (in a directory)."""
    assert out is not None
    if out.is_dir():
        return out / name
    if not out.parent.is_dir():
        raise ExportError(f"export: {out.parent} is not a directory")
    return out


def _cwd_of(path: Path) -> str | None:
    """The working directory an existing transcript/rollout was written for (its first line
    that names one, itself or in its ``payload``, among the first 64), or None."""
    try:
        with open(path, "rb") as f:
            for _, raw in zip(range(64), f):
                try:
                    obj = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    continue
                holder = obj.get("payload") if isinstance(obj, dict) and isinstance(obj.get("payload"), dict) else obj
                if isinstance(holder, dict) and isinstance(holder.get("cwd"), str) and holder["cwd"]:
                    return holder["cwd"]
    except OSError:
        return None
    return None


def _write_new(path: Path, data: bytes, result: ExportResult, make_parents: bool) -> None:
    """Create ``path`` with ``data`` (complete or not at all), never replacing a file."""
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.parent.is_dir():
        raise ExportError(f"export: {path.parent} is not a directory")
    if path.exists() or path.is_symlink():
        raise ExportExists(f"export: {path} exists (nothing written; remove it or choose another --out)", result)
    tmp = write_temp(path, data)
    try:
        os.link(tmp, path)
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            raise ExportExists(f"export: {path} exists (nothing written; remove it or choose another --out)",
                               result) from None
        raise
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)
