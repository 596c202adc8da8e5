"""``memfs gc``, ``pin``, ``unpin``, ``pack``, ``migrate`` and ``fsck``: keeping a store."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from memfs.cli.common import (
    Commands,
    ProgressBar,
    _config,
    _existing,
    _json,
    _nonneg_float,
    _nonneg_int,
    _out,
    _root,
    _size,
)
from memfs.store import fsck as fsck_mod
from memfs.store import migrate as migrate_mod
from memfs.store import pack as pack_mod
from memfs.store import retention


def cmd_gc(args: argparse.Namespace) -> int:
    config = _config(args, max_sessions=args.max_sessions, max_age_days=args.max_age_days)
    _existing(config.sessions_root())
    policy = retention.Policy(config.retention.max_sessions, config.retention.max_age_days)
    if not args.dry_run and not args.yes and not _gc_confirmed(config.sessions_root(), policy, args.preserve):
        return 1
    with ProgressBar("gc") as bar:
        report = retention.gc(config.sessions_root(), policy, preserve=args.preserve, dry_run=args.dry_run,
                              progress=bar)
    if args.json:
        _json(report.to_dict())
        return 0
    would = "would " if args.dry_run else ""
    for name in report.marked_completed:
        _out(f"{would}mark {name} completed (active, idle past {policy.max_age_days:g} days, not open)")
    for r in report.removed:
        _out(f"{would}remove {r.name} ({r.detail}; {_size(r.bytes)})")
    if report.removed:
        n = len(report.removed)
        _out(f"{would}remove {n} session{'s' if n != 1 else ''}, freeing {_size(report.bytes_freed)}"
             if args.dry_run else f"removed {n} session{'s' if n != 1 else ''}, freed {_size(report.bytes_freed)}")
    else:
        _out("nothing to remove")
    return 0


def _gc_confirmed(root: Path, policy, preserve) -> bool:
    """Before removing sessions: ask on a terminal; without one, refuse (scripts say --yes).
    True when nothing would be removed."""
    plan = retention.gc(root, policy, preserve=preserve, dry_run=True)
    n = len(plan.removed)
    if not n:
        return True
    what = f"{n} session{'s' if n != 1 else ''} ({_size(plan.bytes_freed)})"
    if not sys.stdin.isatty():
        print(f"memfs: gc would remove {what} from {root}; run with --yes to confirm "
              f"(stdin is not a terminal), or --dry-run to list them", file=sys.stderr)
        return False
    for r in plan.removed[:20]:
        _out(f"  {r.name} (updated {r.updated_at or '?'}; {_size(r.bytes)})")
    if n > 20:
        _out(f"  ... and {n - 20} more (--dry-run lists them all)")
    sys.stdout.write(f"remove {what} from {root}? [y/N] ")
    sys.stdout.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        print("memfs: gc: nothing removed", file=sys.stderr)
        return False
    return True


def cmd_pin(args: argparse.Namespace) -> int:
    record = retention.pin(_root(args), args.session, args.reason)
    if args.json:
        _json(record)
    else:
        _out(f"pinned {args.session}: {args.reason}")
    return 0


def cmd_unpin(args: argparse.Namespace) -> int:
    removed = retention.unpin(_root(args), args.session)
    if args.json:
        _json({"session": args.session, "unpinned": removed})
    else:
        _out(f"unpinned {args.session}" if removed else f"{args.session} was not pinned")
    return 0


def cmd_pack_create(args: argparse.Namespace) -> int:
    path, pack = pack_mod.create_pack(_root(args), args.session, args.output)
    digest = pack_mod.pack_digest(path)
    if args.json:
        _json({"path": str(path), "pack_sha256": digest, **pack})
    else:
        n = len(pack["entries"])
        _out(f"wrote {path} ({n} file{'s' if n != 1 else ''}, "
             f"{_size(sum(e['bytes'] for e in pack['entries']))})")
        _out(f"pack sha256 {digest}")
        _out(f"keep it elsewhere; check later with: memfs pack verify {args.session} --digest {digest}")
    return 0


def cmd_pack_verify(args: argparse.Namespace) -> int:
    result = pack_mod.verify_pack(_root(args), args.session, args.file, digest=args.digest)
    if args.json:
        _json(result.to_dict())
        return 0 if result.verified else 1
    if result.digest_ok is False:
        _out(f"digest mismatch: the pack file's sha256 is {result.pack_sha256}, not {args.digest.strip().lower()} "
             f"(the pack itself was replaced)")
    if not result.valid:
        _out(f"invalid pack {result.pack_path}: {result.reason}")
    else:
        for label, paths in (("mismatch", result.mismatches), ("missing", result.missing),
                             ("unaccounted", result.unaccounted), ("header", result.header),
                             ("refreshed", result.refreshed)):
            for p in paths:
                _out(f"{label:<12}{p}")
        state = "verified" if result.verified else "NOT verified"
        grown = f" (grown by {result.grown_events} event{'s' if result.grown_events != 1 else ''} since the pack)" \
            if result.grown_events else ""
        _out(f"{state}{grown}: {result.checked} file{'s' if result.checked != 1 else ''} checked against "
             f"{result.pack_path}; {len(result.mismatches)} mismatched, {len(result.missing)} missing, "
             f"{len(result.unaccounted)} unaccounted, {len(result.header)} header disagreements")
    return 0 if result.verified else 1


def _pack_usage(args: argparse.Namespace) -> int:
    args.parser.print_usage(sys.stderr)
    print("memfs pack: choose an action: create or verify", file=sys.stderr)
    return 2


def cmd_migrate(args: argparse.Namespace) -> int:
    root = None
    if args.store or args.workspace or args.config:
        config = _config(args)
        if config.store or config.workspace:
            root = config.sessions_root()
    with ProgressBar("migrate") as bar:
        report = migrate_mod.migrate_workspace(args.source, root, remove_legacy=args.remove_legacy,
                                               dry_run=args.dry_run, progress=bar)
    if args.json:
        _json(report.to_dict())
    else:
        would = "would " if args.dry_run else ""
        for item in report.items:
            if item.status == "imported":
                _out(f"{would}import {item.source} -> {item.session}")
            elif item.status == "already-imported":
                _out(f"already imported {item.source} ({item.session})")
            else:
                _out(f"skip {item.source}: {item.status}: {item.reason}")
            if item.removed:
                _out(f"removed {item.source}")
        for folder in report.removed_folders:
            _out(f"removed {folder}/")
        for folder, why in report.kept_folders.items():
            _out(f"kept {folder}/: {why}")
        if not report.items:
            _out(f"no legacy history or trajectory files in {args.source}")
        else:
            _out(f"{would}import {report.imported} of {len(report.items)} into {report.root}")
    return 1 if report.failed else 0


def cmd_fsck(args: argparse.Namespace) -> int:
    root = _root(args)
    with ProgressBar("fsck") as bar:
        reports = fsck_mod.fsck_store(root, args.sessions, progress=bar)
    if args.json:
        _json([r.to_dict() for r in reports])
    else:
        if not reports:
            _out(f"no sessions in {root}")
        for r in reports:
            if r.result in ("skipped", "error"):
                _out(f"{r.name}: {r.result}: {r.note}")
                continue
            _out(f"{r.name}: {r.result} ({r.events} events, {r.turns} turns, {_size(r.log_bytes)}, "
                 f"{r.rejected} rejected)")
            for line in r.repairs:
                _out(f"  repaired: {line}")
            for line in r.damage:
                _out(f"  damage: {line}")
    return 1 if any(r.failed for r in reports) else 0


def register(c: Commands) -> None:
    p = c.add("gc", cmd_gc, json=True,
              epilog="Live, pinned, preserved and active sessions are never removed. Active sessions idle "
                     "past --max-age-days and not open anywhere are first marked completed. Before removing "
                     "anything gc asks on a terminal; without a terminal it refuses unless --yes is given.")
    p.add_argument("--max-sessions", type=_nonneg_int, metavar="N",
                   help="keep at most N removable sessions, newest first (default 50)")
    p.add_argument("--max-age-days", type=_nonneg_float, metavar="D",
                   help="remove completed sessions idle longer than D days (default 30; 0 removes every "
                        "completed session and disables the abandoned sweep)")
    p.add_argument("--preserve", action="append", default=[], metavar="ID",
                   help="never remove this session (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="change nothing; list what would be removed")
    p.add_argument("-y", "--yes", action="store_true",
                   help="remove without asking (needed when stdin is not a terminal)")

    p = c.add("pin", cmd_pin, json=True)
    p.add_argument("session", metavar="SESSION")
    p.add_argument("--reason", required=True, help="why it must be kept")
    p = c.add("unpin", cmd_unpin, json=True)
    p.add_argument("session", metavar="SESSION")

    p = c.add("pack", _pack_usage, parents=())
    pack_sub = p.add_subparsers(dest="pack_command", metavar="ACTION")
    q = pack_sub.add_parser("create", parents=[c.common, c.as_json], help="write derived/audit-pack.json (or -o FILE)",
                            description="Write the session's audit pack (default: derived/audit-pack.json).")
    q.add_argument("session", metavar="SESSION")
    q.add_argument("-o", "--output", metavar="FILE", help="write the pack here instead")
    q.set_defaults(func=cmd_pack_create)
    q = pack_sub.add_parser("verify", parents=[c.common, c.as_json], help="check a session against its audit pack",
                            description="Check the session folder against its audit pack, strictly; exit 0 only "
                                        "when nothing mismatches, is missing or unaccounted, and the header "
                                        "agrees with the files. A log that only grew verifies as 'grown by N "
                                        "events'.")
    q.add_argument("session", metavar="SESSION")
    q.add_argument("file", nargs="?", metavar="FILE", help="the pack (default: derived/audit-pack.json)")
    q.add_argument("--digest", metavar="HEX", help="the SHA-256 'pack create' printed: the pack itself must not "
                                                    "have been replaced")
    q.set_defaults(func=cmd_pack_verify)
    p.set_defaults(parser=p)

    p = c.add("migrate", cmd_migrate, json=True,
              epilog="Sessions go to --store/--workspace when given, else WORKSPACE/.vtcode/sessions.")
    p.add_argument("source", metavar="WORKSPACE",
                   help="the VT Code workspace holding .vtcode/history and .vtcode/logs")
    p.add_argument("--remove-legacy", action="store_true",
                   help="delete the imported legacy files and folders afterwards")
    p.add_argument("--dry-run", action="store_true", help="change nothing; list what would be imported")

    p = c.add("fsck", cmd_fsck, json=True,
              epilog="Exit status 1 when something was repaired or is damaged.")
    p.add_argument("sessions", nargs="*", metavar="SESSION", help="sessions to check (default: all)")
