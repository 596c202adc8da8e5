"""``memfs export``: a session in Claude Code's, Codex's, Markdown or its own JSONL format
(SPEC §11; :mod:`memfs.export`)."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from memfs.cli.common import Commands, _json, _out, _out_bytes, _root
from memfs.export import TARGETS, ExportError, export_session
from memfs.store.session import open_session


def cmd_export(args: argparse.Namespace) -> int:
    root = _root(args)
    with open_session(root, args.session, read_only=True) as handle:
        if args.out is None and args.to in ("markdown", "jsonl"):
            if args.to == "jsonl":
                data = handle.read_bytes(0)
            else:
                try:
                    from memfs.export.markdown import render
                except ImportError:
                    raise ExportError("export: the Markdown export is not available in this build "
                                      "(memfs.export.markdown.render is missing)") from None
                data = render(handle).encode()
            _out_bytes(data)  # control characters made visible (a JSONL log stays the same JSON)
            return 0
        result = export_session(handle, args.to, Path(args.out) if args.out else None, cwd=args.cwd)
    if args.json:
        _json({"path": str(result.path), "conversation_id": result.conversation_id, "argv": result.argv,
               "cwd": result.cwd, "to": result.to})
        return 0
    _out(f"wrote {result.path}")
    if result.argv:
        _out(f"resume: cd {shlex.quote(result.cwd)} && {shlex.join(result.argv)}")
    return 0


def register(c: Commands) -> None:
    p = c.add("export", cmd_export,
              json=True,
              epilog="Without --out, claude and codex go where the CLI looks (~/.claude/projects/<cwd slug>/, "
                     "$CODEX_HOME/sessions/YYYY/MM/DD/) and the resume command is printed; markdown and jsonl go "
                     "to stdout; opencode needs --out (then: opencode import FILE; opencode run --session ID). --out DIR: a CLI store or a HOME holding one (.claude, .codex) gets the CLI's "
                     "layout, another directory the file under its usual name; --out FILE: that file. An "
                     "existing file is never replaced (exit 1, nothing written).")
    p.add_argument("session", metavar="SESSION")
    p.add_argument("--to", choices=TARGETS, required=True, help="the format")
    p.add_argument("--out", metavar="PATH", help="a file, a directory, or a CLI store/HOME (see below)")
    p.add_argument("--cwd", metavar="DIR",
                   help="the directory the CLI will resume in (default: the session's cwd, else this one)")
