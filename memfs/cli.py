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
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import orjson

import memfs
from memfs.config import Config, apply_overrides, load_config
from memfs.errors import CapRewriteError, MemfsError, ValidationError
from memfs.store import fsck as fsck_mod
from memfs.store import listing
from memfs.store import migrate as migrate_mod
from memfs.store import pack as pack_mod
from memfs.store import retention
from memfs.store.config import DURABILITY_MODES, check_evict_to
from memfs.store.session import open_session
from memfs.store.paths import new_session_name_problem, sanitize
from memfs.store.rejected import count_rejected, set_max_rejected_bytes


# --- output helpers ----------------------------------------------------------------------


class ProgressBar:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal.

    Call it as ``bar(done, total)`` (the library's progress callback); use as a context
    manager so the line is cleared at the end.
    """

    WIDTH = 30

    def __init__(self, label: str, stream=None):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.enabled = self.stream.isatty()
        except (AttributeError, ValueError):
            self.enabled = False
        self._last = 0.0
        self._drawn = 0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        filled = self.WIDTH * done // total
        text = f"\r{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{total}"
        self.stream.write(text)
        self.stream.flush()
        self._drawn = len(text)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc) -> None:
        if self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _table(rows: list[list[str]], right: set[int] = frozenset()) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        _out("  ".join(cells).rstrip())


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return f"{exc.strerror}: {exc.filename}"
    return str(exc) or type(exc).__name__


# --- configuration -----------------------------------------------------------------------


def _config(args: argparse.Namespace, **overrides: Any) -> Config:
    """The config file (if any) with the command's flags laid over it."""
    base = load_config(args.config) if getattr(args, "config", None) else Config()
    flags = {"store": getattr(args, "store", None), "workspace": getattr(args, "workspace", None)}
    flags.update(overrides)
    config = apply_overrides(base, flags)
    set_max_rejected_bytes(config.max_rejected_bytes)  # process-wide: see memfs.store.rejected
    return config


def _root(args: argparse.Namespace) -> Path:
    """The store a command works on; it must exist (a mistyped --store is not an empty one)."""
    return _existing(_config(args).sessions_root())


class _NewStore:
    """A writing command on a store that does not exist creates it: called once the work
    began, it says so (once) when the store has come to exist (a mistyped --store shows)."""

    def __init__(self, command: str, root: Path, dry_run: bool = False):
        self.command, self.root = command, root
        self.pending = not os.path.lexists(root)
        if self.pending and dry_run:
            print(f"memfs: {command}: the store {root} does not exist: a run without --dry-run creates it",
                  file=sys.stderr)
            self.pending = False

    def __call__(self, *_: Any) -> None:
        if self.pending and os.path.isdir(self.root):
            self.pending = False
            print(f"memfs: {self.command}: the store {self.root} did not exist: created it", file=sys.stderr,
                  flush=True)


def _existing(root: Path) -> Path:
    if not os.path.lexists(root):
        raise MemfsError(f"no store at {root}: it does not exist (check --store/--workspace)")
    if not os.path.isdir(root):
        raise MemfsError(f"{root} is not a store: not a directory")
    return root



# --- commands ----------------------------------------------------------------------------


def cmd_mount(args: argparse.Namespace) -> int:
    paths = args.paths
    if len(paths) > 2:
        raise _Usage("mount takes at most two arguments: [STORE] MOUNTPOINT")
    store = args.store
    mountpoint = None
    if len(paths) == 2:
        if args.store or args.workspace:
            raise _Usage("give the store either as the first argument or with --store/--workspace")
        store, mountpoint = paths
    elif len(paths) == 1:
        mountpoint = paths[0]
    settings = _mount_options(args.options)  # -o a,b=c: as the flags, which win over them
    flags = dict(session=args.session, read_only=args.read_only, allow_other=args.allow_other, uid=args.uid,
                 gid=args.gid, durability=args.durability, max_events=args.max_events, evict_to=args.evict_to,
                 max_line_bytes=args.max_line_bytes, max_rejected_bytes=args.max_rejected_bytes,
                 idle_release=args.idle_release, max_open_sessions=args.max_open_sessions,
                 daemon=args.daemon, log_level=args.log_level)
    if args.cluster is not None:
        flags["cluster.servers"] = args.cluster
    settings.update({k: v for k, v in flags.items() if v is not None})
    config = _config(args, store=store, mountpoint=mountpoint, **settings)
    if not config.mountpoint:
        raise _Usage("mount needs a MOUNTPOINT (an argument or mountpoint in --config)")
    try:
        from memfs.fs.mount import run
    except ImportError as exc:
        raise MemfsError(f"cannot mount: the filesystem layer is unavailable ({exc})") from None
    return run(config)


# -o options (mount(8)/sshfs style) → settings; each is also a flag of `memfs mount`.
_O_BOOL = {"ro": ("read_only", True), "rw": ("read_only", False), "allow_other": ("allow_other", True),
           "daemon": ("daemon", True), "foreground": ("daemon", False)}
_O_VALUE = {"uid": int, "gid": int, "durability": str, "max_events": int, "evict_to": float, "max_line_bytes": int,
            "max_rejected_bytes": int, "idle_release": float, "max_open_sessions": int, "session": str,
            "log_level": str.upper}
_O_ALWAYS = ("default_permissions", "auto_unmount", "nodev", "nosuid", "noatime")  # memfs always does these


def _mount_options(groups: list[str]) -> dict[str, Any]:
    """``-o ro,uid=1000`` (repeatable) → config settings; a usage error names a bad one."""
    settings: dict[str, Any] = {}
    for group in groups or ():
        for item in filter(None, group.split(",")):
            key, eq, value = item.partition("=")
            key = key.replace("-", "_")
            if key in _O_BOOL and not eq:
                name, on = _O_BOOL[key]
                settings[name] = on
            elif key in _O_VALUE and eq:
                try:
                    settings[key] = _O_VALUE[key](value)
                except ValueError:
                    raise _Usage(f"-o {item}: {key} takes "
                                 f"{'a number' if _O_VALUE[key] in (int, float) else 'a value'}") from None
            elif key in _O_ALWAYS and not eq:
                continue
            elif key == "cluster" and eq:  # -o cluster=nats://a:4222,nats://b:4222: the URLs after it follow
                settings["cluster.servers"] = value
            elif item.startswith(("nats://", "tls://")) and "cluster.servers" in settings:
                settings["cluster.servers"] += "," + item
            else:
                known = ", ".join([*_O_BOOL, *(f"{k}=" for k in _O_VALUE), "cluster="])
                raise _Usage(f"unknown mount option -o {item} (known: {known})")
    return settings


def cmd_umount(args: argparse.Namespace) -> int:
    try:
        from memfs.fs.mount import unmount
    except ImportError as exc:
        raise MemfsError(f"cannot unmount: the filesystem layer is unavailable ({exc})") from None
    return unmount(args.mountpoint, lazy=True) if args.lazy else unmount(args.mountpoint)


def cmd_mounts(args: argparse.Namespace) -> int:
    from memfs.fs.registry import memfs_mounts

    mounts = memfs_mounts()
    if args.store or args.workspace:
        root = os.path.abspath(_root(args))
        mounts = [m for m in mounts if m["store"] == root]
    if args.json:
        _json(mounts)
        return 0
    if not mounts:
        _out("no memfs mounts")
        return 0
    rows = [["MOUNTPOINT", "STORE", "PID", "CLUSTER", "LAG", "LOG"]]
    for m in mounts:
        store = m["store"] + (f" (session {m['session']})" if m.get("session") else "")
        lag = m.get("cluster_lag")
        rows.append([m["mountpoint"], store, str(m.get("pid") or "?"), m.get("cluster") or "-",
                     "-" if not m.get("cluster") else "?" if lag is None else f"{lag:.3f}s", m.get("log") or "-"])
    _table(rows)
    return 0


def cmd_sessions(args: argparse.Namespace) -> int:
    root = _root(args)
    every = retention.list_sessions(root)
    sessions = list(filter(listing.Filter(args.agent, args.project, args.status, args.since), every))
    if args.json:
        _json([listing.entry(s) for s in sessions])
    elif not sessions:
        _out(f"no sessions in {root}" if not every else f"none of the {len(every)} sessions in {root} match")
    else:
        _table(listing.rows(sessions, shutil.get_terminal_size((100, 24)).columns), right=listing.RIGHT)
    return 0


def _since(text: str) -> float:
    try:
        return listing.parse_since(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_show(args: argparse.Namespace) -> int:
    root = _root(args)
    with open_session(root, args.session, read_only=True) as handle:
        if args.view:
            from memfs.views import render_view

            data = render_view(handle, args.view)  # the view's exact bytes
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
            return 0
        if args.turn is not None:
            start, end, outcome = handle.turn_range(args.turn)
            events = handle.reconstruct_turn(args.turn)
            if args.json:
                _json({"turn": args.turn, "outcome": outcome, "start_offset": start, "end_offset": end,
                       "events": events})
            else:
                for event in events:
                    _out(orjson.dumps(event).decode())
            return 0
        manifest = handle.manifest
        turns = handle.turn_index
        times = handle.turn_times()  # arrival times memfs recorded (index/turn-times.jsonl)
        for t in turns:
            t["started_at"], t["completed_at"] = times.get(t["turn_number"], (None, None))
        path = handle.path
        extra = {"name": handle.name, "path": str(path), "log_bytes": handle.file_len,
                 "rejected": count_rejected(path), "pin": retention.read_pin(path),
                 "live": memfs.is_live(path)}
    if args.json:
        _json({"manifest": manifest, **extra, "turns": turns})
        return 0
    pin = extra["pin"]
    # turn_count counts closed turns (abandoned ones too); the table also lists the open one
    lines = [
        ("session", manifest["session_id"] + ("" if manifest["session_id"] == extra["name"] else f" (dir {extra['name']})")),
        ("status", manifest["status"] + (" (in a turn)" if manifest["in_turn"] else "")),
        ("turns", f"{manifest['turn_count']} closed" + (", 1 open" if manifest["in_turn"] else "")
                  + (f" (retained from {manifest['retained_turn_base']})"
                     if manifest["retained_turn_base"] > 1 else "")),
        ("events", str(manifest["event_count"])),
        ("created", manifest["created_at"]),
        ("updated", manifest["updated_at"]),
        ("log", _size(extra["log_bytes"])),
        ("rejected", str(extra["rejected"])),
        ("pinned", "no" if pin is None else f"yes ({pin.get('reason', '')})"),
        ("live", "yes" if extra["live"] else "no"),
    ]
    for key, value in lines:
        _out(f"{key:<9} {value}")
    if turns:
        _out()
        rows = [["TURN", "OUTCOME", "EVENTS", "OFFSETS", "STARTED", "ENDED"]]
        for t in turns:
            rows.append([str(t["turn_number"]), t.get("outcome", "?"), str(t["event_count"]),
                         f"{t['start_offset']}-{t['end_offset']}", t["started_at"] or "-", t["completed_at"] or "-"])
        _table(rows, right={0, 2})
    return 0


def cmd_append(args: argparse.Namespace) -> int:
    config = _config(args, max_events=args.max_events, evict_to=args.evict_to, max_line_bytes=args.max_line_bytes)
    root = config.sessions_root()
    if not (root / sanitize(args.session)).exists():  # creating it: the name must be fit for one
        problem = new_session_name_problem(sanitize(args.session))
        if problem:
            raise MemfsError(problem)
    new_store = _NewStore("append", root)
    source = sys.stdin.buffer if args.file in (None, "-") else open(args.file, "rb")
    appended, refused, failure = 0, [], None
    rest = (lambda n: f"tail -n +{n} {args.file}") if args.file not in (None, "-") else \
        (lambda n: f"the input from line {n}")
    try:
        with open_session(root, args.session, durability="write", max_events=config.max_events,
                          evict_to=config.evict_to, max_line_bytes=config.max_line_bytes) as handle:
            name = handle.name
            new_store()
            lineno = 0  # lines of the input before the batch
            for batch in _line_batches(source):
                done = 0  # lines of the batch appended or refused
                while done < len(batch) and failure is None:
                    try:
                        n = handle.append_many(batch[done:] if done else batch)
                    except ValidationError as exc:  # (recorded in rejected.jsonl)
                        appended += exc.accepted
                        done += exc.accepted + 1
                        refused.append((lineno + done, str(exc)))
                        if not args.keep_going:
                            failure = (lineno + done, f"refused: {exc} (recorded in rejected.jsonl); "
                                                      f"{_lines(appended)} before it appended, nothing after it: to "
                                                      f"go on, append {rest(lineno + done + 1)} (or use "
                                                      f"--keep-going)")
                        continue
                    except CapRewriteError as exc:
                        appended += exc.accepted
                        done += exc.accepted
                        failure = (lineno + done, f"appended, but {exc}; {_lines(appended)} appended, nothing after it")
                        continue
                    appended += n
                    done += n
                if failure is not None:
                    break
                lineno += len(batch)
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    if args.json:
        _json({"session": name, "appended": appended, "ok": failure is None and not refused,
               "line": failure[0] if failure else None, "reason": failure[1] if failure else None,
               "refused": [{"line": n, "reason": r} for n, r in refused]})
    elif failure is None:
        _out(f"appended {_lines(appended)} to {name}" +
             (f"; refused {_lines(len(refused))} (recorded in rejected.jsonl)" if refused else ""))
    if failure is not None:
        print(f"memfs: append: session {name} line {failure[0]}: {failure[1]}", file=sys.stderr)
        return 1
    for lineno, reason in refused:
        print(f"memfs: append: session {name} line {lineno}: refused: {reason}", file=sys.stderr)
    return 1 if refused else 0


def _line_batches(source, limit: int = 16 << 20):
    """The lines of ``source`` (without their newline), in batches of what can be read now,
    up to about ``limit`` bytes: a file is taken in large batches (one ``append_many`` each: a
    cap crossed several times in one batch rewrites the log once, see
    :class:`memfs.store.evict.Eviction`), while a pipe's lines are appended as soon as they
    arrive (a batch never waits for more input)."""
    import select

    try:
        fd = source.fileno()
    except (AttributeError, OSError, ValueError):  # not a file descriptor (a test's BytesIO)
        while batch := source.readlines(limit):
            yield [line[:-1] if line.endswith(b"\n") else line for line in batch]
        return
    tail = b""
    eof = False
    while not eof:
        chunks = [tail]
        size = len(tail)
        while True:
            chunk = os.read(fd, limit - size)
            if not chunk:
                eof = True
                break
            chunks.append(chunk)
            size += len(chunk)
            if size >= limit or not select.select([fd], [], [], 0)[0]:
                break
        lines = b"".join(chunks).split(b"\n")
        tail = lines.pop()
        if eof and tail:
            lines.append(tail)  # a last line without its newline
        if lines:
            yield lines


def _lines(n: int) -> str:
    return f"{n} line{'s' if n != 1 else ''}"


def cmd_record(args: argparse.Namespace) -> int:
    from memfs.ingest.record import NotRunnable, record

    cmd = list(args.cmd)
    if not cmd:
        raise _Usage("record needs the agent's command after --")
    config = _config(args, max_events=args.max_events, evict_to=args.evict_to)
    sys.stdout.flush()
    root = config.sessions_root()
    new_store = _NewStore("record", root)
    try:
        status, report = record(root, args.session, cmd, fmt=args.format, max_events=config.max_events,
                                evict_to=config.evict_to)
    except NotRunnable as exc:  # as a shell says it, with its status
        print(f"memfs: record: {exc}", file=sys.stderr)
        return exc.status
    new_store()  # (after the agent: its stderr is untouched)
    if report.refused:
        print(f"memfs record: {_lines(report.refused)} of the agent's output refused (see rejected.jsonl)",
              file=sys.stderr)
    if report.closed_turn:
        print(f"memfs record: closed the open turn as failed: {report.closed_turn}", file=sys.stderr)
    return status


def cmd_import(args: argparse.Namespace) -> int:
    from memfs.ingest import importer

    config = _config(args, max_events=args.max_events, evict_to=args.evict_to)
    root = config.sessions_root()
    would = "would " if args.dry_run else ""
    new_store = _NewStore("import", root, dry_run=args.dry_run)

    def show(item) -> None:
        new_store()
        if args.json:
            sys.stdout.write(orjson.dumps(item.to_dict()).decode() + "\n")
            sys.stdout.flush()
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
        if args.dry_run:
            raise _Usage("--follow and --dry-run do not go together")
        importer.follow(root, args.paths, fmt=args.format, max_events=config.max_events, evict_to=config.evict_to,
                        report=show)
        return 0
    with ProgressBar("import") as bar:
        items = importer.import_paths(root, args.paths, fmt=args.format, dry_run=args.dry_run,
                                      max_events=config.max_events, evict_to=config.evict_to, progress=bar)
    new_store()
    if args.json:
        _json([i.to_dict() for i in items])
    else:
        for item in items:
            show(item)
        if not items:
            _out("no files to import")
    return 1 if any(i.status in ("error", "changed") for i in items) else 0


def cmd_search(args: argparse.Namespace) -> int:
    config = _config(args, max_results=args.k, min_score=args.min_score)
    from memfs.search import search_store

    session = sanitize(args.session) if args.session else None  # an id or a directory name
    results = search_store(_existing(config.sessions_root()), args.query, session=session,
                           k=config.search.max_results, min_score=config.search.min_score)
    results = list(results)
    if args.json:
        _json(results)
        return 0
    if not results:
        _out("no results")
    for r in results:
        snippet = " ".join(str(r.get("snippet", "")).split())
        _out(f"{r['score']:.4f}\t{r['chunk_id']}\t{snippet}")
    return 0


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


# --- the parser --------------------------------------------------------------------------


class _Usage(Exception):
    """A usage error found after parsing (exit 2)."""


def _nonneg_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _pos_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _evict_to(text: str) -> float:
    try:
        value = float(text)
        check_evict_to(value)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a number from 0.5 to 1.0") from None
    return value


EVICT_TO_HELP = ("once over the cap, evict whole completed turns down to FRACTION x max-events "
                 "(0.5-1.0, default 0.9; 1.0: just under the cap, a rewrite at almost every turn)")


def _nonneg_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    which = common.add_mutually_exclusive_group()
    which.add_argument("--store", metavar="DIR", help="the sessions root (default: $XDG_DATA_HOME/memfs/sessions)")
    which.add_argument("--workspace", metavar="DIR", help="a VT Code workspace: use DIR/.vtcode/sessions")
    common.add_argument("--config", metavar="FILE", help="a TOML config file (see mount.example.toml); flags override it")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="machine-readable JSON output")

    parser = argparse.ArgumentParser(
        prog="memfs", description="An AI coding agent's session memory as a plain directory.",
        epilog="Run 'memfs COMMAND --help' for a command's options.")
    parser.add_argument("--version", action="version", version=f"memfs {memfs.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, func: Callable, help: str, parents=(common,), **kw) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=list(parents), help=help, description=help, **kw)
        p.set_defaults(func=func)
        return p

    p = add("mount", cmd_mount, "serve a store (or one session) as a FUSE filesystem",
            usage="memfs mount [options] [STORE] MOUNTPOINT")
    p.add_argument("paths", nargs="*", metavar="[STORE] MOUNTPOINT",
                   help="the sessions root (optional; default as --store) and where to mount")
    flag = {"action": "store_const", "const": True, "default": None}
    p.add_argument("--session", metavar="ID", help="mount this session only (the form to hand to a sandbox)")
    p.add_argument("--read-only", help="refuse every write (EROFS); also -o ro", **flag)
    p.add_argument("--allow-other", help="let other users access the mount (needs user_allow_other)", **flag)
    p.add_argument("--uid", type=_nonneg_int, metavar="N", help="owner uid reported for every node")
    p.add_argument("--gid", type=_nonneg_int, metavar="N", help="owner gid reported for every node")
    p.add_argument("--durability", choices=DURABILITY_MODES, help="how appends reach the disk (default: write)")
    p.add_argument("--max-events", type=_nonneg_int, metavar="N", help="event cap per session (0 = unlimited)")
    p.add_argument("--evict-to", type=_evict_to, metavar="FRACTION", help=EVICT_TO_HELP)
    p.add_argument("--max-line-bytes", type=_nonneg_int, metavar="N", help="longest accepted line")
    p.add_argument("--max-rejected-bytes", type=_nonneg_int, metavar="N",
                   help="rotate rejected.jsonl past N bytes (default 16 MiB)")
    p.add_argument("--idle-release", type=_nonneg_float, metavar="SECONDS",
                   help="a session's writer lock is released this long after its last change (default 5)")
    p.add_argument("--max-open-sessions", type=_nonneg_int, metavar="N",
                   help="sessions kept open at once, one descriptor each (default 256)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--daemon", help="detach once the mount is up; log to a file named after the mountpoint",
                      **flag)
    mode.add_argument("-f", "--foreground", dest="daemon", action="store_const", const=False,
                      help="stay in the foreground, logging to stderr (the default)")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]",
                   help="mount(8)-style options, each also a flag: ro, rw, allow_other, uid=N, gid=N, "
                        "durability=MODE, max_events=N, evict_to=F, max_line_bytes=N, max_rejected_bytes=N, "
                        "idle_release=S, max_open_sessions=N, session=ID, cluster=URL[,URL...], "
                        "log_level=LEVEL")
    p.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), type=str.upper)
    p.add_argument("--cluster", metavar="URL[,URL...]",
                   help="cluster mode (SPEC §9): replicate through these NATS JetStream servers; also "
                        "-o cluster=URL,URL and [cluster] servers in the config (needs memfs[cluster])")

    p = add("umount", cmd_umount, "unmount a memfs mount")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("-l", "--lazy", action="store_true",
                   help="detach now even if busy; the server flushes and exits once the last user is gone")

    add("mounts", cmd_mounts, "list the memfs mounts: mountpoint, store, server pid and log (with --store/"
                              "--workspace: that store's only)", parents=(common, as_json))

    p = add("sessions", cmd_sessions, "list sessions, most recently updated first", parents=(common, as_json),
            epilog="Columns: last activity (UTC), agent, project, title, turns, status, tokens, cost, session. "
                   "--json carries every field of each session's metadata (index/about.json).")
    p.add_argument("--agent", metavar="NAME", help="only sessions of this agent (claude, codex, gemini, vtcode, ...)")
    p.add_argument("--project", metavar="P", help="only sessions of this project: its path or name, or a directory "
                                                  "the session ran in or under")
    p.add_argument("--status", choices=listing.STATUSES, help="only sessions with this status")
    p.add_argument("--since", type=_since, metavar="WHEN",
                   help="only sessions active since WHEN: a date or time (2026-01-31, UTC) or an age (7d, 12h)")

    p = add("show", cmd_show, "a session's summary, a turn's events, or a derived view", parents=(common, as_json))
    p.add_argument("session", metavar="SESSION")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--turn", type=int, metavar="N", help="print the events of turn N, one JSON object a line")
    what.add_argument("--view", metavar="NAME", help="print a derived view (e.g. memory.json, summary.md)")

    p = add("append", cmd_append, "validated append of event lines without a mount", parents=(common, as_json),
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

    from memfs.ingest import FORMATS

    p = add("record", cmd_record, "run an agent, pass its output through, and record its events in SESSION",
            usage="memfs record [options] SESSION [--format F] -- CMD [ARGS...]",
            epilog="The agent's stdout is copied through unchanged and its stderr is untouched; its event "
                   "stream (Codex exec --json, or Claude Code / Gemini CLI stream-json, translated) is appended as it "
                   "arrives. Refused lines go to rejected.jsonl and never stop the agent. The exit status "
                   "is the agent's (128+N when killed by signal N; 127 or 126, as in a shell, when it cannot run).")
    p.add_argument("session", metavar="SESSION")
    p.add_argument("--format", choices=FORMATS, default="auto", help="the agent's output format (default: auto)")
    p.add_argument("--max-events", type=_nonneg_int, metavar="N", help="event cap (default 10000; 0 = unlimited)")
    p.add_argument("--evict-to", type=_evict_to, metavar="FRACTION", help=EVICT_TO_HELP)
    p.set_defaults(cmd=[])  # main() gives it everything after "--"

    p = add("import", cmd_import, "bring Codex, Claude Code and Gemini CLI transcripts in as sessions (idempotent)",
            parents=(common, as_json),
            epilog="Codex exec --json output, Codex rollout files (~/.codex/sessions), Claude Code stream-json "
                   "output and transcripts (~/.claude/projects), Gemini CLI stream-json output and chat files "
                   "(~/.gemini/tmp). A DIR yields its *.jsonl files, recursively. "
                   "Each file becomes a session named by its thread/session id; what was imported is "
                   "remembered in the session's index/import-sources.json, so importing again adds only "
                   "new lines. Exit status 1 when a file failed or changed since its last import.")
    p.add_argument("paths", nargs="+", metavar="FILE|DIR")
    p.add_argument("--format", choices=FORMATS, default="auto", help="the files' format (default: auto, per file)")
    p.add_argument("--dry-run", action="store_true", help="change nothing; say what would be imported")
    p.add_argument("--follow", action="store_true",
                   help="keep watching the DIRs (inotify) and append lines as the tools write them; "
                        "Ctrl-C or SIGTERM stops")
    p.add_argument("--max-events", type=_nonneg_int, metavar="N", help="event cap per session (default 10000; 0 = unlimited)")
    p.add_argument("--evict-to", type=_evict_to, metavar="FRACTION", help=EVICT_TO_HELP)

    p = add("search", cmd_search, "BM25 search over the sessions' grounded facts", parents=(common, as_json))
    p.add_argument("query", metavar="QUERY")
    p.add_argument("--session", metavar="S", help="search this session only")
    p.add_argument("-k", type=_pos_int, metavar="N", help="number of results, at least 1 (default 6; as ?k=N "
                                                        "on a mount's search files)")
    p.add_argument("--min-score", type=float, metavar="X", help="drop results scoring below X (default 0)")

    p = add("gc", cmd_gc, "apply the retention policy: remove old, surplus and empty completed sessions",
            parents=(common, as_json),
            epilog="Live, pinned, preserved and active sessions are never removed. Active sessions idle "
                   "past --max-age-days and not open anywhere are first marked completed. Before removing "
                   "anything gc asks on a terminal; without a terminal it refuses unless --yes is given.")
    p.add_argument("--max-sessions", type=_nonneg_int, metavar="N",
                   help="keep at most N removable sessions, newest first (default 50)")
    p.add_argument("--max-age-days", type=_nonneg_float, metavar="D",
                   help="remove completed sessions idle longer than D days (default 30; 0 removes every "
                        "completed session and disables the abandoned sweep)")
    p.add_argument("--preserve", action="append", default=[], metavar="ID", help="never remove this session (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="change nothing; list what would be removed")
    p.add_argument("-y", "--yes", action="store_true",
                   help="remove without asking (needed when stdin is not a terminal)")

    p = add("pin", cmd_pin, "pin a session against retention", parents=(common, as_json))
    p.add_argument("session", metavar="SESSION")
    p.add_argument("--reason", required=True, help="why it must be kept")
    p = add("unpin", cmd_unpin, "remove a session's retention pin", parents=(common, as_json))
    p.add_argument("session", metavar="SESSION")

    p = add("pack", _usage_of, "audit packs: hash every file of a session, verify later", parents=())
    pack_sub = p.add_subparsers(dest="pack_command", metavar="ACTION")
    q = pack_sub.add_parser("create", parents=[common, as_json], help="write derived/audit-pack.json (or -o FILE)",
                            description="Write the session's audit pack (default: derived/audit-pack.json).")
    q.add_argument("session", metavar="SESSION")
    q.add_argument("-o", "--output", metavar="FILE", help="write the pack here instead")
    q.set_defaults(func=cmd_pack_create)
    q = pack_sub.add_parser("verify", parents=[common, as_json], help="check a session against its audit pack",
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

    p = add("migrate", cmd_migrate, "import a VT Code workspace's legacy history and trajectory files",
            parents=(common, as_json),
            epilog="Sessions go to --store/--workspace when given, else WORKSPACE/.vtcode/sessions.")
    p.add_argument("source", metavar="WORKSPACE", help="the VT Code workspace holding .vtcode/history and .vtcode/logs")
    p.add_argument("--remove-legacy", action="store_true", help="delete the imported legacy files and folders afterwards")
    p.add_argument("--dry-run", action="store_true", help="change nothing; list what would be imported")

    p = add("fsck", cmd_fsck, "rescan sessions, repair their metadata, report damage", parents=(common, as_json),
            epilog="Exit status 1 when something was repaired or is damaged.")
    p.add_argument("sessions", nargs="*", metavar="SESSION", help="sessions to check (default: all)")
    return parser


def _usage_of(args: argparse.Namespace) -> int:
    args.parser.print_usage(sys.stderr)
    print("memfs pack: choose an action: create or verify", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    agent: list[str] | None = None
    if "record" in argv and "--" in argv and argv.index("record") < argv.index("--"):
        cut = argv.index("--")  # record's agent command is everything after "--", options included
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
        print(f"memfs: {exc}", file=sys.stderr)
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
        print(f"memfs: {_reason(exc)}", file=sys.stderr)
        return 1

