"""``memfs resume SESSION --in claude|codex [-- ARGS…]``: continue a session in an agent's CLI
and keep what it adds (SPEC §11).

:func:`resume_session`:

1. exports the session into the tool's own store (:func:`memfs.export.export_session`: the
   user's ``~/.claude`` / ``$CODEX_HOME``, as ``HOME`` and ``CODEX_HOME`` say), and notes in
   the session's ``index/import-sources.json`` that the exported file, as written, is already
   in the session (:func:`memfs.ingest.importer.remember_as_imported`);
2. runs the tool's resume command (the export's ``argv`` + ``ARGS``) as a child with the
   terminal passed through (stdin, stdout and stderr inherited; SIGINT ignored by memfs while
   it runs — the terminal sends it to the tool — SIGTERM and SIGHUP forwarded);
3. imports what the tool appended to that file into the same session
   (:func:`memfs.ingest.importer.import_into`): only the bytes after the export are read, and
   the identity layer still drops anything the session already holds.

Decisions recorded here:

* The new turns come back by importing the file the tool appended to (both CLIs append to the
  resumed transcript/rollout), not by ``record``: the terminal stays the tool's (an
  interactive resume works), and the file has what a stream lacks (the prompt, Codex's
  per-turn token totals). Only what follows the export is imported, so a session exported to
  another agent (whose ids the export had to make up) does not come back twice.
* A non-interactive resume passes the prompt in ``ARGS``, in the tool's own syntax: ARGS are
  appended verbatim to the resume command — ``-- -p "next"`` for Claude Code
  (``claude --resume ID -p next``) and ``-- "next"`` for Codex (``codex exec resume ID
  next``); with no ARGS the tool resumes interactively.
* Where the tool runs: ``--cwd DIR`` (``cwd``) when given; else, on a resume that goes on with
  a file already in the tool's store, the directory that file was written for (Claude Code finds
  a transcript by the project it runs in); else the session's ``cwd`` when that is a directory
  here; else the current one (and the export is placed for it). A directory read from a file
  (the session's metadata, the tool's own file) is used only when it is absolute, has no ``.``
  or ``..`` component and no control character, and its real path (symbolic links resolved) is
  an existing directory; anything else is refused with a one-line reason (:class:`ResumeRefused`)
  before anything is exported — only a session ``cwd`` that is merely missing here falls back to
  the current directory. The directory used, and where it came from, is told (``tell``) before
  the tool starts.
* A resume never writes one session's turns into another: the export is written only under a
  conversation id that is the session's own (:func:`memfs.export.export_session`; a fork has its
  own, :mod:`memfs.store.fork`), and the tool's file is brought back only when it names that
  conversation.
* The exit status is the tool's (128+N when it was killed by signal N); when the import back
  fails, that is reported and the status is 1 unless the tool's was already non-zero.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from memfs import agents
from memfs.errors import MemfsError
from memfs.store import about
from memfs.store.session import open_session

TARGETS = agents.writers()  # the agents memfs writes a file for (memfs.agents)


@dataclass
class Resumed:
    """What :func:`resume_session` did: the exported ``path``, the ``argv`` it ran, the tool's
    exit ``status``, and the import back (``appended`` events, ``duplicates`` dropped,
    ``error`` when it failed)."""

    session: str
    path: str
    argv: list[str]
    status: int
    appended: int = 0
    duplicates: int = 0
    refused: int = 0
    error: str | None = None


def run_passthrough(argv: Sequence[str], cwd: str | None = None) -> int:
    """Run ``argv`` with this process's stdin, stdout and stderr; return its exit status
    (128+N for signal N). SIGINT is ignored meanwhile, SIGTERM and SIGHUP forwarded."""
    proc = subprocess.Popen(list(argv), cwd=cwd)

    def forward(signum, frame):
        if proc.poll() is None:
            proc.send_signal(signum)

    saved = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP)}
    saved[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        status = proc.wait()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    return 128 - status if status < 0 else status


class ResumeRefused(MemfsError):
    """A resume refused before the tool ran (a working directory that cannot be used, a file
    of another conversation); nothing was exported."""

    errno_name = "EINVAL"


def cwd_problem(value) -> str | None:
    """Why ``value`` (read from a file, or given) cannot be the tool's working directory, or None."""
    if not isinstance(value, str) or not value:
        return "it is not a path"
    if not value.isprintable():
        return "it holds control characters"
    if not os.path.isabs(value):
        return "it is not absolute"
    if {".", ".."} & set(value.split("/")):
        return "it has a '.' or '..' component"
    if not os.path.isdir(os.path.realpath(value)):
        return "it is not a directory here"
    return None


def checked_cwd(value, origin: str) -> str:
    """``value``'s real path when :func:`cwd_problem` finds nothing, else :class:`ResumeRefused`
    (``origin`` says where the directory came from)."""
    problem = cwd_problem(value)
    if problem is not None:
        raise ResumeRefused(f"resume: the working directory {origin} ({value!r}) is not used: {problem} "
                            "(choose one with --cwd DIR)")
    return os.path.realpath(value)


def session_cwd(value) -> tuple[str, str]:
    """The directory to run in when neither ``--cwd`` nor an existing file says, and why."""
    here = os.path.realpath(os.getcwd())
    if value is None:
        return here, "the current directory (the session records no cwd)"
    if cwd_problem(value) == "it is not a directory here" and isinstance(value, str):
        return here, f"the current directory (the session's cwd {value!r} is not a directory here)"
    return checked_cwd(value, "the session records"), "the session's cwd"


def _check_conversation(path: Path, uid: str) -> None:
    """The tool's file must name the conversation the session is exported as."""
    from memfs.ingest.importer import identify

    try:
        _kind, sid = identify(path, "auto")
    except (MemfsError, OSError) as exc:
        raise ResumeRefused(f"resume: {path} cannot be read: {exc}") from None
    if sid is not None and sid != uid:
        raise ResumeRefused(f"resume: {path} holds conversation {sid!r}, not {uid} (nothing run)")


def resume_session(root: str | os.PathLike, session: str, to: str, args: Sequence[str] = (), *,
                   home: str | os.PathLike | None = None, max_events: int = 0, cwd: str | None = None,
                   tell: Callable[[str], None] | None = None) -> Resumed:
    """Export ``session`` for ``to`` (one of :data:`TARGETS`; an agent with a ``resume.py`` in
    its folder continues its own way: :func:`memfs.agents.resumer`), run its resume command with
    ``args`` in ``cwd`` (or the directory the module docstring says), and import the new turns
    back. ``tell`` gets one line naming the directory before the tool starts. Raises before the
    tool runs when the session does not exist, cannot be exported, a working directory is refused
    (:class:`ResumeRefused`) or the tool cannot run (:class:`memfs.ingest.record.NotRunnable`); a
    failing import back is reported in :attr:`Resumed.error`."""
    from memfs.export import ExportExists, export_session
    from memfs.ingest.importer import import_into, read_sources, remember_as_imported
    from memfs.ingest.record import check_runnable

    if to not in TARGETS:
        raise ValueError(f"resume --in must be one of {', '.join(TARGETS)}")
    root = Path(root)
    chosen = checked_cwd(os.path.abspath(cwd), "given by --cwd") if cwd is not None else None
    own = agents.resumer(to)  # (an agent whose CLI does not continue the exported file: its own way)
    if own is not None:
        return own.resume(root, session, args, home, max_events, chosen, tell)
    with open_session(root, session, read_only=True) as handle:
        check_runnable(agents.command_of(to))  # (NotRunnable: 127 or 126, as a shell says it; nothing exported)
        name = handle.name
        where, origin = (chosen, "--cwd") if chosen is not None else session_cwd(about.read(handle.path).get("cwd"))
        try:
            exported, fresh = export_session(handle, to, home=Path(home) if home else None, cwd=where), True
        except ExportExists as exc:  # resumed before (or exported): go on with that file
            exported, fresh = exc.result, False
    path = Path(exported.path)
    if not fresh:
        _check_conversation(path, exported.conversation_id)
        if chosen is None and exported.cwd != where:  # (read back from the tool's file)
            where, origin = checked_cwd(exported.cwd, f"recorded in {path}"), f"the cwd recorded in {path}"
    if tell is not None:
        tell(f"memfs resume: {to} runs in {where} ({origin})")
    argv = [*exported.argv, *args]
    if fresh:
        remember_as_imported(root, path, name)
    elif str(path.resolve()) not in read_sources(root / name):
        import_into(root, path, name, max_events=max_events)  # what it holds that the session lacks
    result = Resumed(name, str(path), argv, run_passthrough(argv, where))
    try:
        item = import_into(root, path, name, max_events=max_events)
    except Exception as exc:  # (the tool's work is in its own file: say so, keep its status)
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.appended, result.duplicates, result.refused = item.appended, item.duplicates, item.refused
    if item.status in ("changed", "error"):
        result.error = item.reason or item.status
    return result
