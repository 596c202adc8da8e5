"""Which memfs mounts exist, and where their servers log (SPEC §6 mount conventions).

The kernel's mount table (``/proc/self/mountinfo``) is the truth about what is mounted: a
memfs mount has the type ``fuse.memfs`` and the source ``memfs:<store path>``. Each server
also leaves a small record (pid, store, log, session) in a registry directory —
``$XDG_RUNTIME_DIR/memfs/mounts/`` when ``XDG_RUNTIME_DIR`` is set, else
``$XDG_STATE_HOME/memfs/mounts/`` — named after its mountpoint, and removes it on exit; a
record whose mount is gone (a killed server) is ignored and deleted when listed.

A daemon logs to ``$XDG_STATE_HOME/memfs/logs/<mountpoint>.log`` (``~/.local/state/...``),
the mountpoint's path with ``/`` written as ``-`` (``-`` itself as ``%2D``, ``%`` as ``%25``):
one log per mount, so two daemons never share one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from memfs.store.paths import pid_alive

FSTYPE = "fuse.memfs"
SOURCE_PREFIX = "memfs:"


def state_home() -> Path:
    """memfs's state directory's parent: ``$XDG_STATE_HOME``, else ``~/.local/state``."""
    return Path(os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state"))


def mount_key(mountpoint: str | os.PathLike) -> str:
    """A file name for a mountpoint (an absolute path, taken as given: no system call, so a
    server may name its own mountpoint without a request to itself): ``/home/a/mem-x`` →
    ``home-a-mem%2Dx``."""
    rel = os.path.abspath(mountpoint).strip("/")
    return rel.replace("%", "%25").replace("-", "%2D").replace("/", "-") or "root"


def log_path(mountpoint: str | os.PathLike) -> Path:
    """Where the daemon serving ``mountpoint`` logs."""
    return state_home() / "memfs" / "logs" / f"{mount_key(mountpoint)}.log"


def registry_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return (Path(runtime) if runtime else state_home()) / "memfs" / "mounts"


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as ``\\ooo``."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit() and len(field[i + 1:i + 4]) == 3:
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mountinfo() -> list[tuple[str, str, str]]:
    """``(mountpoint, fstype, source)`` of every mount in the kernel's table."""
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(" "), right.split(" ")
        if sep and len(fields) >= 5 and len(tail) >= 2:
            out.append((_unescape(fields[4]), tail[0], tail[1]))
    return out


def is_mounted(path: str | os.PathLike) -> bool:
    """Whether anything (memfs or not) is mounted at ``path`` (its real path)."""
    target = os.path.realpath(path)
    return any(mountpoint == target for mountpoint, _type, _source in _mountinfo())


def kernel_mounts() -> list[dict]:
    """memfs mounts in the kernel's table: ``{"mountpoint", "store"}``."""
    found = []
    for mountpoint, fstype, raw_source in _mountinfo():
        if fstype != FSTYPE:
            continue
        source = _unescape(raw_source)
        store = source[len(SOURCE_PREFIX):] if source.startswith(SOURCE_PREFIX) else ""
        found.append({"mountpoint": mountpoint, "store": store.replace("\\,", ",")})
    return found


def memfs_mount_at(mountpoint: str | os.PathLike) -> dict | None:
    """The memfs mount at ``mountpoint`` (its real path), or None."""
    mounts = kernel_mounts()
    for target in (os.path.abspath(mountpoint), os.path.realpath(mountpoint)):
        for m in mounts:
            if m["mountpoint"] == target:
                return m
    return None


def register(mountpoint: str, record: dict) -> Path:
    """Write this server's record (best effort: a failure only loses ``memfs mounts`` detail)."""
    path = registry_dir() / f"{mount_key(mountpoint)}.json"
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)
    except OSError:
        pass
    return path


def unregister(path: Path) -> None:
    try:
        record = json.loads(path.read_text())
        if record.get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def memfs_mounts() -> list[dict]:
    """Every memfs mount: ``{"mountpoint", "store", "pid", "log", "session", "read_only",
    "cluster", "cluster_lag"}`` (pid and log None when no record of its server is found;
    ``cluster`` the stream name of a cluster-mode mount, else None; ``cluster_lag`` its
    replica's lag in seconds, read from the mount root's ``user.memfs.cluster_lag``)."""
    records = {}
    directory = registry_dir()
    try:
        names = os.listdir(directory)
    except OSError:
        names = []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            record = json.loads((directory / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("mountpoint"), str):
            records[record["mountpoint"]] = (directory / name, record)
    mounts = []
    for m in kernel_mounts():
        _path, record = records.pop(m["mountpoint"], (None, {}))
        pid = record.get("pid")
        if pid is not None and not _alive(pid):
            record = {}
        mounts.append({"mountpoint": m["mountpoint"], "store": m["store"] or record.get("store", ""),
                       "pid": record.get("pid"), "log": record.get("log"), "session": record.get("session"),
                       "read_only": record.get("read_only"), "cluster": record.get("cluster"),
                       "cluster_lag": cluster_lag(m["mountpoint"]) if record.get("cluster") else None})
    for path, record in records.values():  # their mount is gone: a killed server's leftovers
        if not _alive(record.get("pid", -1)):
            try:
                path.unlink()
            except OSError:
                pass
    return mounts


def cluster_lag(mountpoint: str) -> float | None:
    """The lag a cluster-mode mount reports on its root (SPEC §9), None when it cannot say
    (only asked of mounts whose live server registered cluster mode)."""
    try:
        return float(os.getxattr(mountpoint, "user.memfs.cluster_lag"))
    except (OSError, ValueError):
        return None


def _alive(pid) -> bool:
    return type(pid) is int and pid > 0 and pid_alive(pid)
