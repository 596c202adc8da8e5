"""Serving a store with pyfuse3 on trio: options, signals, clean shutdown (SPEC §6, §8).

:func:`run` takes a :class:`memfs.config.Config`. SIGINT and SIGTERM end the loop; every open
session is then flushed with its metadata persisted, and only then is the mount removed.
With ``daemon`` the process forks once the mount is up, the parent prints the server's pid
and returns; the server logs to :func:`daemon_log_path`.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyfuse3
import trio

from memfs import views
from memfs.errors import MemfsError
from memfs.fs.ops import MountOptions, Operations
from memfs.search import store_searcher
from memfs.store.paths import sanitize
from memfs.store.root import Store, StoreSettings

log = logging.getLogger("memfs.fs")


def fuse_options(config) -> set[str]:
    options = set(pyfuse3.default_options) | {"fsname=memfs", "subtype=memfs", "auto_unmount"}
    if config.allow_other:
        options.add("allow_other")
    if config.read_only:
        options.add("ro")
    return options


def build(config) -> tuple[Store, Operations]:
    """The store and the operations a config describes (no mount yet)."""
    settings = StoreSettings(durability=config.durability, max_events=config.max_events,
                             max_line_bytes=config.max_line_bytes, read_only=config.read_only)
    store = Store(config.sessions_root(), settings)
    single = None
    if config.session:
        single = sanitize(config.session)
        if not store.exists(single):
            if config.read_only:
                raise MemfsError(f"no session {config.session!r} in {store.root}")
            store.create(single)
    options = MountOptions(single_session=single, read_only=config.read_only,
                           uid=os.getuid() if config.uid is None else config.uid,
                           gid=os.getgid() if config.gid is None else config.gid)
    searcher = store_searcher(store, max_results=config.max_results, min_score=config.min_score)
    return store, Operations(store, options, searcher=searcher)


async def _serve(store: Store, ops: Operations) -> None:
    async with trio.open_nursery() as nursery:

        async def stop_on_signal():
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    log.info("signal %s: unmounting", signal.Signals(signum).name)
                    pyfuse3.terminate()
                    return

        async def warm_search_index():
            warm = getattr(ops.searcher, "warm", None)
            if warm is None:
                return
            for name in await trio.to_thread.run_sync(store.names):
                try:  # one session per thread call: shutdown need not wait for the rest
                    await trio.to_thread.run_sync(warm, [name])
                except Exception:
                    log.exception("warming the search index with %s", name)

        nursery.start_soon(stop_on_signal)
        nursery.start_soon(warm_search_index)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


def run(config) -> int:
    """Mount and serve until unmounted or signalled; return an exit status."""
    logging.basicConfig(level=getattr(logging, str(config.log_level).upper(), logging.INFO),
                        format="memfs[%(process)d] %(levelname)s %(message)s")
    mountpoint = Path(config.mountpoint).expanduser()
    if not mountpoint.is_dir():
        raise MemfsError(f"mountpoint {mountpoint} is not a directory")
    raise_fd_limit()
    store, ops = build(config)
    ready_w = None
    if config.daemon:
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid:
            os.close(ready_w)
            ok = os.read(ready_r, 1) == b"1"
            os.close(ready_r)
            if ok:
                print(pid, flush=True)
                return 0
            return 1
        os.close(ready_r)
        os.setsid()
    try:
        pyfuse3.init(ops, str(mountpoint), fuse_options(config))
    except BaseException:
        store.close()
        if ready_w is not None:
            os.write(ready_w, b"0")
            os._exit(1)
        raise
    log.info("serving %s at %s", store.root, mountpoint)
    if ready_w is not None:
        _detach_stdio()
        os.write(ready_w, b"1")
        os.close(ready_w)
    _keep_shutdown_whole()
    try:
        trio.run(_serve, store, ops)
    finally:
        try:
            views.flush()  # views copied to the backing store are written before we go
            store.close()
        finally:
            pyfuse3.close(unmount=True)
    log.info("unmounted %s", mountpoint)
    if ready_w is not None:
        os._exit(0)
    return 0


def _keep_shutdown_whole() -> None:
    """SIGINT/SIGTERM outside the serving loop (trio's receiver handles them while it runs and
    puts these back after) must not cut the final flush short: log them and carry on (SPEC §6:
    a second signal during shutdown does not cut it short)."""

    def already_stopping(signum, _frame):
        log.warning("signal %s: already shutting down; finishing the flush first", signal.Signals(signum).name)

    signal.signal(signal.SIGINT, already_stopping)
    signal.signal(signal.SIGTERM, already_stopping)


def raise_fd_limit() -> None:
    """A server holds two descriptors per open session (log and lock): lift the soft limit
    on open files to the hard one, as far as it goes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
        except (ValueError, OSError):
            log.warning("could not raise the open-files limit above %d", soft)


def daemon_log_path() -> Path:
    """Where a daemon logs: ``$XDG_STATE_HOME/memfs/memfs.log`` (``~/.local/state/...``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "memfs" / "memfs.log"


def _detach_stdio() -> None:
    """A daemon keeps no terminal or pipe open (whoever started it may wait for EOF); its log
    goes to :func:`daemon_log_path`."""
    path = daemon_log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s memfs[%(process)d] %(levelname)s %(message)s"))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def unmount(mountpoint: str | os.PathLike) -> int:
    """Unmount a memfs mount (``fusermount3 -u``); the server then flushes and exits."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        print("memfs: fusermount3 not found (install fuse3)", file=sys.stderr)
        return 1
    result = subprocess.run([tool, "-u", str(mountpoint)], capture_output=True, text=True)
    if result.returncode:
        print(f"memfs: {result.stderr.strip() or 'unmount failed'}", file=sys.stderr)
    return result.returncode
