"""Sessions out (SPEC §11): a session written in a tool's own format so that its CLI continues
it — :func:`export_session`.

Targets: ``claude`` (a Claude Code transcript, :mod:`memfs.agents.claude.write`), ``codex`` (a Codex
rollout, :mod:`memfs.agents.codex.write`), ``opencode`` (a file for ``opencode import``,
:mod:`memfs.agents.opencode.write`; it needs an ``out``), ``markdown`` (:func:`memfs.export.markdown.render`) and
``jsonl`` (the session's own log, byte for byte).

Where the file goes (``out``; docs/design.md "Export: where --out puts the file"):

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
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from memfs import agents
from memfs.agents.claude import write as claude
from memfs.agents.codex import write as codex
from memfs.agents.opencode import write as opencode
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
    if to == "opencode":
        return _export_opencode(conv, out, home, where)
    if to == "claude":
        argv = ["claude", "--resume", uid]
        store = _store(out, home, ".claude", ("projects",), os.environ.get("CLAUDE_CONFIG_DIR"))
        if store is not None:
            path = claude.transcript_path(store, where, uid)
            taken = sorted((store / "projects").glob(f"*/{uid}.jsonl")) if (store / "projects").is_dir() else []
        else:
            path, taken = _file(out, f"{uid}.jsonl"), []
        data = claude.render(conv, where)
    else:
        argv = ["codex", "exec", "resume", uid]
        store = _store(out, home, ".codex", ("sessions", "config.toml"), os.environ.get("CODEX_HOME"))
        if store is not None:
            data = codex.render(conv, where, _provider(store))
            path = codex.rollout_path(store, uid, data[0]["timestamp"])
            taken = sorted(p for d in ("sessions", "archived_sessions") if (store / d).is_dir()
                           for p in (store / d).rglob(f"rollout-*-{uid}.jsonl*"))
        else:
            data = codex.render(conv, where, None)
            path = _file(out, codex.rollout_path(Path("."), uid, data[0]["timestamp"]).name)
            taken = []
    result = ExportResult(path=path, conversation_id=uid, argv=argv, cwd=where, to=to)
    if taken:
        existing = taken[0]
        there = _cwd_of(existing, to) or where
        raise ExportExists(f"export: {existing} already holds conversation {uid}; "
                           f"`{' '.join(argv)}` continues it (nothing written)",
                           ExportResult(existing, uid, argv, there, to))
    _write_new(path, b"".join(orjson.dumps(line) + b"\n" for line in data), result, make_parents=store is not None)
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
def _export_opencode(conv: Conversation, out: Path | None, home: Path | None, where: str) -> ExportResult:
    """``opencode import FILE`` reads a file anywhere: ``out`` (a file, or a directory for
    ``<session id>.json``) is needed. The provider and model are the target OpenCode's (its
    config under ``home``, default ``$XDG_CONFIG_HOME`` or ``~/.config``)."""
    if out is None:
        raise ExportError("export: --to opencode needs --out (a file or a directory); then `opencode import FILE`")
    base = Path(home) / ".config" if home is not None else Path(os.environ.get("XDG_CONFIG_HOME") or
                                                              Path.home() / ".config")
    provider, model = opencode.target_model(base / "opencode")
    doc = opencode.render(conv, where, provider, model)
    sid = doc["info"]["id"]
    path = _file(out, f"{sid}.json")
    result = ExportResult(path=path, conversation_id=sid, argv=["opencode", "import", str(path)], cwd=where,
                          to="opencode")
    _write_new(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n", result, make_parents=False)
    return result


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
    path = _file(out, name)
    result = ExportResult(path=path, conversation_id=conv_id if isinstance(conv_id, str) else handle.name, to=to)
    _write_new(path, data, result, make_parents=False)
    return result


def _store(out: Path | None, home: Path | None, dirname: str, marks: tuple[str, ...], env: str | None) -> Path | None:
    """The CLI's store ``out`` names (None: ``out`` is a plain file or directory)."""
    if out is None:
        if home is not None:
            return Path(home) / dirname
        return Path(env) if env else Path.home() / dirname
    if out.name == dirname or (out.is_dir() and any((out / m).exists() for m in marks)):
        return out
    if (out / dirname).is_dir():
        return out / dirname
    return None


def _file(out: Path | None, name: str) -> Path:
    assert out is not None
    if out.is_dir():
        return out / name
    if not out.parent.is_dir():
        raise ExportError(f"export: {out.parent} is not a directory")
    return out


def _cwd_of(path: Path, to: str) -> str | None:
    """The working directory an existing transcript/rollout was written for (its first line
    that names one, among the first 64), or None."""
    try:
        with open(path, "rb") as f:
            for _, raw in zip(range(64), f):
                try:
                    obj = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    continue
                holder = obj.get("payload") if to == "codex" and isinstance(obj, dict) else obj
                if isinstance(holder, dict) and isinstance(holder.get("cwd"), str) and holder["cwd"]:
                    return holder["cwd"]
    except OSError:
        return None
    return None


def _provider(codex_home: Path) -> str | None:
    """The model provider the Codex in ``codex_home`` is configured with (its ``config.toml``
    ``model_provider``), or None — then the rollout names none, which Codex resumes under
    whatever provider it runs with (a rollout naming another one is refused)."""
    try:
        with open(codex_home / "config.toml", "rb") as f:
            provider = tomllib.load(f).get("model_provider")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return provider if isinstance(provider, str) and provider else None


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
