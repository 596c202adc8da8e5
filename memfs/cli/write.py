"""``memfs append``, ``record`` and ``import``: writing sessions without a mount."""

from __future__ import annotations

import argparse
import sys

import orjson

from memfs.cli.common import (
    EVICT_TO_HELP,
    Commands,
    ProgressBar,
    _config,
    _err,
    _evict_to,
    _json,
    _lines,
    _NewStore,
    _nonneg_int,
    _out,
    _pos_int,
    _Usage,
)
from memfs.errors import MemfsError
from memfs.store.batch import append_stream
from memfs.store.paths import new_session_name_problem, sanitize
from memfs.store.session import open_session


def cmd_append(args: argparse.Namespace) -> int:
    config = _config(args, max_events=args.max_events, evict_to=args.evict_to, max_line_bytes=args.max_line_bytes)
    root = config.sessions_root()
    if not (root / sanitize(args.session)).exists():  # creating it: the name must be fit for one
        problem = new_session_name_problem(sanitize(args.session))
        if problem:
            raise MemfsError(problem)
    new_store = _NewStore("append", root)
    source = sys.stdin.buffer if args.file in (None, "-") else open(args.file, "rb")
    rest = (lambda n: f"tail -n +{n} {args.file}") if args.file not in (None, "-") else \
        (lambda n: f"the input from line {n}")
    try:
        with open_session(root, args.session, durability="write", max_events=config.max_events,
                          evict_to=config.evict_to, max_line_bytes=config.max_line_bytes) as handle:
            name = handle.name
            new_store()
            result = append_stream(handle, source, keep_going=args.keep_going,
                                   max_line_bytes=config.max_line_bytes)
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    appended, refused, failure = result.accepted, result.refused, None
    if result.cap_error is not None:
        failure = (result.stopped_at, f"appended, but {result.cap_error}; {_lines(appended)} appended, "
                                      f"nothing after it")
    elif result.stopped_at is not None:
        failure = (result.stopped_at, f"refused: {refused[-1][1]} (recorded in rejected.jsonl); {_lines(appended)} "
                                      f"before it appended, nothing after it: to go on, append "
                                      f"{rest(result.stopped_at + 1)} (or use --keep-going)")
    if args.json:
        _json({"session": name, "appended": appended, "ok": failure is None and not refused,
               "line": failure[0] if failure else None, "reason": failure[1] if failure else None,
               "refused": [{"line": n, "reason": r} for n, r in refused]})
    elif failure is None:
        _out(f"appended {_lines(appended)} to {name}" +
             (f"; refused {_lines(len(refused))} (recorded in rejected.jsonl)" if refused else ""))
    if failure is not None:
        _err(f"memfs: append: session {name} line {failure[0]}: {failure[1]}")
        return 1
    for lineno, reason in refused:
        _err(f"memfs: append: session {name} line {lineno}: refused: {reason}")
    return 1 if refused else 0


def cmd_record(args: argparse.Namespace) -> int:
    from memfs.ingest.record import NotRunnable, record

    cmd = list(args.cmd)
    if not cmd:
        raise _Usage("record needs the agent's command after --")
    config = _config(args, max_events=args.max_events, evict_to=args.evict_to, max_line_bytes=args.max_line_bytes)
    sys.stdout.flush()
    root = config.sessions_root()
    new_store = _NewStore("record", root)
    try:
        status, report = record(root, args.session, cmd, fmt=args.format, max_events=config.max_events,
                                evict_to=config.evict_to, max_line_bytes=config.max_line_bytes)
    except NotRunnable as exc:  # as a shell says it, with its status
        _err(f"memfs: record: {exc}")
        return exc.status
    new_store()  # (after the agent: its stderr is untouched)
    if report.refused:
        _err(f"memfs record: {_lines(report.refused)} of the agent's output refused (see rejected.jsonl)")
    if report.closed_turn:
        _err(f"memfs record: closed the open turn as failed: {report.closed_turn}")
    return status


IMPORT_REFUSED = 3  # memfs import: something was skipped or refused, nothing failed


def _import_status(items) -> int:
    """``memfs import``'s exit status: 1 when a file failed or changed since its last import,
    else :data:`IMPORT_REFUSED` when a file was skipped or a line refused (the counts are said
    on stderr), else 0."""
    if any(i.status in ("error", "changed") for i in items):
        return 1
    skipped = sum(i.status == "skipped" for i in items)
    refused = sum(i.refused for i in items)
    if not skipped and not refused:
        return 0
    print(f"memfs: import: {skipped} file{'s' if skipped != 1 else ''} skipped, {_lines(refused)} refused "
          f"(see each session's rejected.jsonl)", file=sys.stderr)
    return IMPORT_REFUSED


def cmd_import(args: argparse.Namespace) -> int:
    from memfs.ingest import importer

    config = _config(args, max_events=args.max_events, evict_to=args.evict_to, max_line_bytes=args.max_line_bytes)
    root = config.sessions_root()
    would = "would " if args.dry_run else ""
    new_store = _NewStore("import", root, dry_run=args.dry_run)

    def show(item) -> None:
        new_store()
        if args.json:
            _out(orjson.dumps(item.to_dict()).decode())
        elif item.status == "imported":
            _out(f"{would}import {item.source} -> {item.session} ({item.format}): {_lines(item.lines)}, "
                 f"{item.appended} event{'s' if item.appended != 1 else ''}"
                 + (f", {item.refused} refused (see rejected.jsonl)" if item.refused else ""))
        elif item.status == "up-to-date":
            _out(f"up to date {item.source} ({item.session})")
        elif item.status == "empty":
            _out(f"skip {item.source}: empty")
        else:
            _out(f"skip {item.source}: {item.status}: {item.reason}")
        sys.stdout.flush()

    if args.follow:
        if args.dry_run or args.jobs:
            raise _Usage(f"--follow and {'--dry-run' if args.dry_run else '--jobs'} do not go together")
        from memfs.agents.opencode.read import split_stores
        from memfs.ingest.follow import follow

        seen = []

        def keep(item) -> None:
            seen.append(importer.ImportItem(item.source, status=item.status, refused=item.refused))
            show(item)

        stores, paths = split_stores(args.paths)
        follow(root, paths, fmt=args.format, max_events=config.max_events, evict_to=config.evict_to,
               max_line_bytes=config.max_line_bytes, report=keep, stores=stores,
               notice=lambda text: print(f"memfs: import: {text}", file=sys.stderr, flush=True))
        return _import_status([i for i in seen if i.status not in ("error", "changed")])  # (errors: retried)
    with ProgressBar("import") as bar:
        items = importer.import_paths(root, args.paths, fmt=args.format, dry_run=args.dry_run,
                                      max_events=config.max_events, evict_to=config.evict_to, progress=bar,
                                      max_line_bytes=config.max_line_bytes, jobs=args.jobs)
    new_store()
    if args.json:
        _json([i.to_dict() for i in items])
    else:
        for item in items:
            show(item)
        if not items:
            _out("no files to import")
    return _import_status(items)


def register(c: Commands) -> None:
    from memfs.ingest import FORMATS

    p = c.add("append", cmd_append, json=True,
              epilog="Stops at the first refused line: the lines before it stay appended, the refused one "
                     "goes to rejected.jsonl, the message says how many were appended and where to go on, and "
                     "the exit status is 1. With --keep-going every refused line is recorded and skipped.")
    p.add_argument("session", metavar="SESSION")
    p.add_argument("file", nargs="?", metavar="FILE", help="JSON lines to append (default or '-': stdin)")
    p.add_argument("--max-events", type=_nonneg_int, metavar="N", help="event cap (default 10000; 0 = unlimited)")
    p.add_argument("--evict-to", type=_evict_to, metavar="FRACTION", help=EVICT_TO_HELP)
    p.add_argument("--max-line-bytes", type=_nonneg_int, metavar="N", help="longest accepted line (default 16 MiB)")
    p.add_argument("--keep-going", action="store_true",
                   help="record refused lines in rejected.jsonl and go on with the next line (exit 1 if any)")

    p = c.add("record", cmd_record,
              usage="memfs record [options] SESSION [--format F] -- CMD [ARGS...]",
              epilog="The agent's stdout is copied through unchanged and its stderr is untouched; its event "
                     "stream (Codex exec --json, or Claude Code / Gemini CLI stream-json, opencode run --format json, "
                     "translated) is appended "
                     "as it arrives. Refused lines go to rejected.jsonl and never stop the agent. The exit status "
                     "is the agent's (128+N when killed by signal N; 127 or 126, as in a shell, when it cannot "
                     "run).")
    p.add_argument("session", metavar="SESSION")
    p.add_argument("--format", choices=FORMATS, default="auto", help="the agent's output format (default: auto)")
    p.add_argument("--max-events", type=_nonneg_int, metavar="N", help="event cap (default 10000; 0 = unlimited)")
    p.add_argument("--evict-to", type=_evict_to, metavar="FRACTION", help=EVICT_TO_HELP)
    p.add_argument("--max-line-bytes", type=_nonneg_int, metavar="N",
                   help="longest accepted line of the agent's output (default 16 MiB)")
    p.set_defaults(cmd=[])  # main() gives it everything after "--"

    p = c.add("import", cmd_import, json=True,
              epilog="Codex exec --json output, Codex rollout files (~/.codex/sessions), Claude Code stream-json "
                     "output and transcripts (~/.claude/projects), Gemini CLI stream-json output and chat files "
                     "(~/.gemini/tmp), opencode run --format json output and OpenCode's database "
                     "(~/.local/share/opencode, read-only: one session per OpenCode session). "
                     "A DIR yields its *.jsonl files, recursively. "
                     "Each file becomes a session named by its thread/session id; what was imported is "
                     "remembered in the session's index/import-sources.json, so importing again adds only "
                     "new lines. Only regular files are read, never through a symbolic link: links, FIFOs, "
                     "sockets and devices are skipped with their reason; a line over --max-line-bytes is refused "
                     "(to the session's rejected.jsonl) without being read into memory. Exit status: 0 all read; "
                     "1 a file failed or changed since its last import; 3 a file was skipped or a line refused "
                     "(the counts are said on stderr).")
    p.add_argument("paths", nargs="+", metavar="FILE|DIR")
    p.add_argument("--format", choices=FORMATS, default="auto", help="the files' format (default: auto, per file)")
    p.add_argument("--dry-run", action="store_true", help="change nothing; say what would be imported")
    p.add_argument("--follow", action="store_true",
                   help="keep watching the DIRs and OpenCode's database (inotify) and append what the tools "
                        "write as they write it; Ctrl-C or SIGTERM stops")
    p.add_argument("--max-events", type=_nonneg_int, metavar="N",
                   help="event cap per session (default 10000; 0 = unlimited)")
    p.add_argument("--evict-to", type=_evict_to, metavar="FRACTION", help=EVICT_TO_HELP)
    p.add_argument("--max-line-bytes", type=_nonneg_int, metavar="N",
                   help="longest accepted source line (default 16 MiB)")
    p.add_argument("--jobs", type=_pos_int, metavar="N",
                   help="processes reading the files (default: one per CPU, up to 4, once there are 64 MiB to read)")
