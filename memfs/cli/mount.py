"""``memfs mount``, ``umount`` and ``mounts``: serving a store as a filesystem."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from memfs.cli.common import (
    EVICT_TO_HELP,
    Commands,
    _config,
    _evict_to,
    _json,
    _nonneg_float,
    _nonneg_int,
    _out,
    _root,
    _table,
    _Usage,
)
from memfs.errors import MemfsError
from memfs.store.config import DURABILITY_MODES


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
_O_VALUE: dict[str, Callable[[str], Any]] = {
    "uid": int, "gid": int, "durability": str, "max_events": int, "evict_to": float, "max_line_bytes": int,
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


def register(c: Commands) -> None:
    p = c.add("mount", cmd_mount,
              usage="memfs mount [options] [STORE] MOUNTPOINT")
    p.add_argument("paths", nargs="*", metavar="[STORE] MOUNTPOINT",
                   help="the sessions root (optional; default as --store) and where to mount")
    flag: dict[str, Any] = {"action": "store_const", "const": True, "default": None}
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

    p = c.add("umount", cmd_umount)
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("-l", "--lazy", action="store_true",
                   help="detach now even if busy; the server flushes and exits once the last user is gone")

    c.add("mounts", cmd_mounts, json=True)
