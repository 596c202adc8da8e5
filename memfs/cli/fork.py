"""``memfs fork`` and ``memfs resume``: a session goes on elsewhere (SPEC §11)."""

from __future__ import annotations

import argparse
import sys

from memfs import agents
from memfs.cli.common import Commands, _config, _err, _existing, _json, _lines, _nonneg_int, _out, _pos_int


def cmd_fork(args: argparse.Namespace) -> int:
    from memfs.ingest.conversations import register
    from memfs.store.fork import fork_session

    config = _config(args)
    root = _existing(config.sessions_root())
    forked = fork_session(root, args.session, args.new, at_turn=args.at_turn)
    register(root, forked.conversation_id, forked.agent, forked.name)  # (its own conversation: an import finds it)
    if args.json:
        _json(forked.to_dict())
    else:
        turns = "no turns" if forked.at_turn is None else \
            f"{forked.turns} turn{'s' if forked.turns != 1 else ''} (to turn {forked.at_turn}" + \
            (", still open)" if forked.open else ")")
        _out(f"forked {forked.source} -> {forked.name}: {turns}, {_lines(forked.lines)}")
    if forked.refused:
        _err(f"memfs: fork: {_lines(forked.refused)} of {forked.source} refused by the store "
             f"(see {forked.name}/rejected.jsonl)")
        return 1
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from memfs.export.resume import resume_session
    from memfs.ingest.record import NotRunnable

    config = _config(args, max_events=args.max_events)
    root = _existing(config.sessions_root())
    sys.stdout.flush()
    try:
        result = resume_session(root, args.session, args.tool, args.cmd, max_events=config.max_events,
                                cwd=args.cwd, tell=lambda line: print(line, file=sys.stderr, flush=True))
    except NotRunnable as exc:
        _err(f"memfs: resume: {exc}")
        return exc.status
    if result.error:
        _err(f"memfs: resume: the new turns were not brought back into {result.session}: {result.error} "
             f"(the tool's record is {result.path}; 'memfs import' it)")
        return result.status or 1
    _err(f"memfs resume: {result.appended} event{'s' if result.appended != 1 else ''} appended to "
         f"{result.session}" + (f", {result.refused} refused (see rejected.jsonl)" if result.refused else ""))
    return result.status


def register(c: Commands) -> None:
    p = c.add("fork", cmd_fork, json=True,
              epilog="The new session's log is the source's lines, verbatim, up to the end of turn N (the whole "
                     "log by default); its index/about.json records forked_from and forked_at_turn, and a "
                     "conversation id of its own (its export and resume never continue the source's). The source "
                     "is only read. Refused, with exit status 1: NEW exists or is not a valid session name, "
                     "N is not one of the source's turns.")
    p.add_argument("session", metavar="SESSION")
    p.add_argument("new", metavar="NEW", help="the new session's name (letters, digits, '-', '_', '.')")
    p.add_argument("--at-turn", type=_pos_int, metavar="N", help="copy turns up to N (default: all)")

    p = c.add("resume", cmd_resume,
              usage="memfs resume [options] SESSION --in claude|codex|opencode [--cwd DIR] [-- ARGS...]",
              epilog="Exports SESSION into the tool's own store (~/.claude, $CODEX_HOME), runs its resume command "
                     "(claude --resume ID, codex exec resume ID) with ARGS appended and the terminal passed "
                     "through, then imports the turns the tool added into SESSION. For a non-interactive run "
                     "pass the prompt in ARGS: '-- -p \"next\"' (claude), '-- \"next\"' (codex, opencode: opencode run "
                     "--session ID next; OpenCode gets the session through opencode import, once). The tool runs "
                     "in --cwd DIR, else the directory its file (or the session) records when that is an absolute, "
                     "existing directory (printed first; anything else is refused), else the current one. The "
                     "exit status is the tool's.")
    p.add_argument("session", metavar="SESSION")
    p.add_argument("--in", dest="tool", required=True, choices=agents.writers(),
                   help="the tool to resume in")
    p.add_argument("--cwd", metavar="DIR", help="the directory the tool runs in (default: the session's)")
    p.add_argument("--max-events", type=_nonneg_int, metavar="N", help="event cap (default 10000; 0 = unlimited)")
    p.set_defaults(cmd=[])  # ARGS: main() gives it everything after "--"
