"""The ``memfs`` command line (SPEC §8): a thin skin over the library.

Every command takes ``--store DIR`` (the sessions root) or ``--workspace DIR`` (a VT Code
workspace: ``DIR/.vtcode/sessions``), and ``--config FILE`` (see ``mount.example.toml``);
flags override the file. Human-readable output by default; ``--json`` gives one JSON
document (a list for commands that list things). Errors print ``memfs: <reason>`` on stderr
and exit 1; usage errors exit 2. Progress bars go to stderr, only when it is a terminal.

Exit codes: 0 success; 1 an error, a refused line (``append``), an unverified pack
(``pack verify``), a repaired or damaged session (``fsck``), a conflicting or invalid legacy
file (``migrate``); 2 bad usage; 130 interrupted.

Decisions recorded here:

* ``append`` creates the session when it does not exist, as writing to a new file would;
  the commands that write sessions — ``append``, ``record``, ``import``, ``mount`` — also
  create a missing store, and the first three say so on stderr (``memfs: import: the store
  DIR did not exist: created it``), so a mistyped ``--store`` shows. Every other command on a
  store that does not exist says so and exits 1 (a mistyped ``--store`` is not an empty
  store).
* ``record`` of a command that cannot run exits as a shell would (127 not found, 126 not
  executable) with ``memfs: record: CMD: command not found``, and creates nothing.
* ``migrate`` imports into ``--store``/``--workspace`` when given, else the config's store,
  else the migrated workspace's own ``.vtcode/sessions``.
* ``pin`` requires ``--reason`` (a pin without one is a mystery later); ``unpin`` of a
  session that is not pinned says so and succeeds.
"""

from __future__ import annotations

import argparse
import os
import sys

import memfs
from memfs.errors import MemfsError

# name -> (module under memfs.cli, its function that adds the command, the one-line help): the
# command's module is imported only when that command runs; ``memfs --help`` lists every command
# from this table alone (in this order).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "mount": ("mount", "register", "serve a store (or one session) as a FUSE filesystem"),
    "umount": ("mount", "register", "unmount a memfs mount"),
    "mounts": ("mount", "register", "list the memfs mounts: mountpoint, store, server pid and log (with "
               "--store/--workspace: that store's only)"),
    "sessions": ("sessions", "register", "list sessions, most recently updated first"),
    "show": ("sessions", "register", "a session's summary, a turn's events, or a derived view"),
    "append": ("write", "register", "validated append of event lines without a mount"),
    "record": ("write", "register", "run an agent, pass its output through, and record its events in SESSION"),
    "import": ("write", "register", "bring Codex, Claude Code, Gemini CLI and OpenCode transcripts in as sessions "
               "(idempotent)"),
    "export": ("export", "register", "write a session for Claude Code, Codex, OpenCode, people (Markdown) or as its log"),
    "fork": ("fork", "register", "make a new session from the first turns of another"),
    "resume": ("fork", "register", "continue a session in Claude Code, Codex or OpenCode, and keep the new turns"),
    "search": ("sessions", "register_search", "BM25 search over the sessions' grounded facts"),
    "gc": ("ops", "register", "apply the retention policy: remove old, surplus and empty completed sessions"),
    "pin": ("ops", "register", "pin a session against retention"),
    "unpin": ("ops", "register", "remove a session's retention pin"),
    "pack": ("ops", "register", "audit packs: hash every file of a session, verify later"),
    "migrate": ("ops", "register", "import a VT Code workspace's legacy history and trajectory files"),
    "fsck": ("ops", "register", "rescan sessions, repair their metadata, report damage"),
    "mcp": ("mcp", "register", "serve the memory to MCP clients (Claude Code, Codex, …) over stdio or HTTP"),
    "usage": ("usage", "register", "tokens and cost per day, week, month, session, model, project, agent or "
              "billing block, with totals"),
    "statusline": ("statusline", "register", "one line for Claude Code's statusLine: model, this session's "
                   "cost, today's, the active billing block's and its time left, context tokens (reads the "
                   "statusLine JSON on stdin)"),
    "config": ("settings", "register", "the configuration file the commands read, and the settings in force"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``memfs`` parser. ``command``: the one whose options are parsed (its module is imported
    and adds it, with the other commands of that module); every other command is listed with its
    help only (``memfs --help``, a mistyped command). None: every command in full (tests, docs)."""
    from importlib import import_module

    from memfs.cli.common import Commands

    common = argparse.ArgumentParser(add_help=False)
    which = common.add_mutually_exclusive_group()
    which.add_argument("--store", metavar="DIR", help="the sessions root (default: $XDG_DATA_HOME/memfs/sessions)")
    which.add_argument("--workspace", metavar="DIR", help="a VT Code workspace: use DIR/.vtcode/sessions")
    common.add_argument("--config", metavar="FILE", help="a TOML config file (see mount.example.toml; default: "
                        "$XDG_CONFIG_HOME/memfs/config.toml when it exists); flags override it")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="machine-readable JSON output")

    parser = argparse.ArgumentParser(
        prog="memfs", description="An AI coding agent's session memory as a plain directory.",
        epilog="Run 'memfs COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"memfs {memfs.__version__}")
    commands = Commands(parser.add_subparsers(dest="command", metavar="COMMAND"), common, as_json)
    done: set[tuple[str, str]] = set()
    for name, (module, register, _help) in COMMANDS.items():
        if (command is None or name == command) and (module, register) not in done:
            done.add((module, register))
            getattr(import_module(f"memfs.cli.{module}"), register)(commands)
    for name, (_module, _register, help_) in COMMANDS.items():
        if name not in commands.sub.choices:  # listed in --help (in the table's order when none is chosen)
            commands.sub.add_parser(name, help=help_)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["statusline"]:  # run at every redraw of Claude Code's status line: loads nothing else
        from memfs.cli.statusline import run

        return run(argv[1:])
    from memfs.cli.common import _err, _reason, _Usage

    parser = build_parser(next((a for a in argv if not a.startswith("-")), ""))
    agent: list[str] | None = None
    if "--" in argv and any(c in argv and argv.index(c) < argv.index("--") for c in ("record", "resume")):
        cut = argv.index("--")  # record's agent command (resume's ARGS) is everything after "--", options included
        argv, agent = argv[:cut], argv[cut + 1:]
    try:
        args = parser.parse_args(argv)
        if agent is not None:
            args.cmd = agent
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except _Usage as exc:
        _err(f"memfs: {exc}")
        return 2
    except KeyboardInterrupt:
        print("memfs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (memfs sessions | head): not an error; keep Python quiet
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
    except (MemfsError, OSError) as exc:
        _err(f"memfs: {_reason(exc)}")
        return 1

