"""Serving a store with pyfuse3 on trio: options, signals, clean shutdown (SPEC §6, §8).

:func:`run` takes a :class:`memfs.config.Config`. SIGINT and SIGTERM end the loop; every open
session is then flushed with its metadata persisted, and only then is the mount removed.
With ``daemon`` the process forks once the mount is up, the parent prints the server's pid
and returns; the server logs to :func:`daemon_log_path` (one file per mountpoint). The
mount's source is ``memfs:<store path>``; a path that already is a memfs mount is refused,
and a missing mountpoint whose parent exists is created.
"""

from __future__ import annotations

import fcntl
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyfuse3
import trio
from memfs import views
from memfs.config import ConfigError
from memfs.errors import MemfsError
from memfs.fs import registry
from memfs.fs.gate import requests_waiting
from memfs.fs.ops import MountOptions, Operations
from memfs.fs.syncer import Durability
from memfs.pace import background, lower_workers, worker_started
from memfs.search.changes import CatalogChanges
from memfs.store import rescanner
from memfs.store.paths import pid_alive, sanitize
from memfs.store.rejected import set_max_rejected_bytes
from memfs.store.rescanner import RescanHelper
from memfs.store.root import Store, StoreSettings

log = logging.getLogger("memfs.fs")

SWITCH_INTERVAL = 0.0005  # seconds a thread may hold the GIL while another waits for it (see run)
# pyfuse3 reads requests in worker tasks: a task whose handler waits (an fsync-mode write for its
# sync, a hop to a worker thread) keeps its task, and when no task is left to read, another is
# started, up to ``max_tasks``; a task that finds more than ``min_tasks`` others idle ends, freeing
# its 1 MiB receive buffer. With pyfuse3's default of 1, concurrent fsync-mode writers made the
# loop start tasks and grow and trim the heap (brk) all the time; 16 idle tasks (at most 16
# receive buffers, resident only as far as requests filled them) keep them. ``MAX_TASKS`` bounds
# the pool (pyfuse3's default is 99): past it, requests wait in the kernel for a task to come
# back, so the receive buffers, and the worker threads requests hop to (``Operations.off_loop``),
# are as many at most.
MIN_TASKS = 16
MAX_TASKS = 32
WARM_RETRY = 5.0  # seconds before the search index's first load is tried again after a failure
WARM_AFTER = 1.0  # seconds after mounting before the search index's warm-up starts
WARM_WAIT, WARM_POLL = 60.0, 0.25  # then it waits for this server's first check of the catalog, this long at most


def fuse_options(config, store_root: Path | None = None) -> set[str]:
    """The FUSE mount options; the source reads ``memfs:<store path>`` in findmnt/mount."""
    root = os.path.abspath(store_root if store_root is not None else config.sessions_root())
    fsname = "memfs:" + root.replace("\\", "\\\\").replace(",", "\\,")  # libfuse splits options at ','
    options = set(pyfuse3.default_options) | {f"fsname={fsname}", "subtype=memfs", "auto_unmount"}
    if config.allow_other:
        options.add("allow_other")
    if config.read_only:
        options.add("ro")
    return options


def fuse_device_fd() -> int | None:
    """This process's descriptor of ``/dev/fuse`` (its FUSE session's), or None if it has none."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                return int(name)
        except OSError:  # (the listing's own descriptor, closed meanwhile)
            continue
    return None


def _last_close(fd: int) -> None:
    """Hold a duplicate of the FUSE session's ``/dev/fuse`` at a high descriptor number, so
    that when this process dies without unmounting (``kill -9``, the OOM killer) the FUSE
    connection ends *before* libfuse's socket to the ``auto_unmount`` helper closes.

    The helper (``fusermount3``) wakes when that socket closes, and unmounts only if opening
    the mountpoint then fails with ``ENOTCONN``. A process's descriptors are closed in
    ascending order at exit, but the files are released last-closed-first (seen on kernel
    6.18): ``/dev/fuse`` (libfuse's descriptor, below the socket's) was released after the
    socket, the helper's open raced the connection's end and failed with ``ECONNABORTED``
    instead, and the dead mount stayed — after 5 of 10 kills with the Python commit while
    another process kept a CPU busy. The duplicate, the process's highest descriptor, is
    closed last and so released first. Best effort: without a free descriptor up there,
    nothing is held (``tests/test_reliability_crash.py::
    test_kill_9_on_a_busy_machine_leaves_no_dead_mount``). This relies on that order: the
    kernel runs a dying task's releases in the reverse of the order they were queued (its
    ``task_work_run`` no longer reverses the list, as Linux 3.x's did); on a kernel that ran
    them first-queued-first, libfuse's own layout was the safe one, and this duplicate would
    undo it."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = 4096 if soft == resource.RLIM_INFINITY else min(soft, 4096)  # (RLIM_INFINITY is -1)
    try:  # (never closed: it goes with the process)
        fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, max(limit - 8, 64))
    except OSError as exc:
        log.debug("no high descriptor for /dev/fuse: %s", exc)


def build(config) -> tuple[Store, Operations]:
    """The store and the operations a config describes (no mount yet)."""
    settings = StoreSettings(durability=config.durability, max_events=config.max_events,
                             max_line_bytes=config.max_line_bytes, read_only=config.read_only,
                             idle_release=config.idle_release, max_open_sessions=config.max_open_sessions,
                             evict_to=config.evict_to)
    set_max_rejected_bytes(config.max_rejected_bytes)
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
    if single is None and store.catalog().ready():
        # a catalog kept from before: what changed while no server watched (a copy, a hand edit)
        # is read on a thread before listings answer from it (they read the folders meanwhile,
        # as behind the build of a missing one)
        store.catalog().check_later()
    # the root search's index: kept up by this mount's notices and the store catalog's change
    # feed (memfs.search.changes), saved in the store unless the mount is read-only
    changes = CatalogChanges(store.root)

    def make():
        from memfs.search import store_searcher

        return store_searcher(store, max_results=config.max_results, min_score=config.min_score,
                              defaults=config.search.params(), changes=changes,
                              persist="load" if config.read_only else "save", elsewhere=True)

    return store, Operations(store, options, searcher=LaterSearcher(make, changes))


class LaterSearcher:
    """The mount's root search (:func:`memfs.search.store_searcher`), made on first use: the
    search stack (numpy, the saved index) is imported by the warm-up's thread once the mount is
    up, not before the mount answers its first request. Notices go to the change source at once
    (what the searcher's own ``notice`` does)."""

    def __init__(self, make, changes: CatalogChanges):
        self._make, self._changes = make, changes
        self._made = None
        self._lock = threading.Lock()

    def _searcher(self):
        if self._made is None:
            with self._lock:
                if self._made is None:
                    self._made = self._make()
        return self._made

    def __call__(self, *args, **kwargs):
        return self._searcher()(*args, **kwargs)

    def notice(self, name: str) -> None:
        self._changes.notice(name)

    def warm(self, names: list[str] | None = None) -> list[str]:  # (on the warm-up's thread: it makes it)
        return self._searcher().warm(names)

    def maintain(self) -> float:
        return self._searcher().maintain()

    def close(self) -> None:
        if self._made is not None:  # (never made: nothing to save)
            self._made.close()

    def __getattr__(self, name: str):  # counters, stats, save, index
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._searcher(), name)


async def _serve(store: Store, ops: Operations) -> None:
    async with trio.open_nursery() as nursery:

        async def stop_on_signal():
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    log.info("signal %s: unmounting", signal.Signals(signum).name)
                    pyfuse3.terminate()
                    return

        async def keep_search_index():
            """The saved index loaded and caught up (sessions changed since it was saved), then,
            for as long as the mount runs, other processes' changes swept for and the index
            saved when it changed (memfs.search.searcher: maintain)."""
            warm = getattr(ops.searcher, "warm", None)
            maintain = getattr(ops.searcher, "maintain", None)
            if warm is None or maintain is None or ops.opts.single_session is not None:
                return

            def idle(fn, *args):  # idle-priority work: it gives way to requests
                worker_started()
                with background(ops.pacer):
                    return fn(*args)

            # the first requests (a listing right after mounting) do not share the interpreter with
            # the search stack's import and the saved index's load, nor does the catalog's first
            # check (their transient memory would add up); a search asked meanwhile makes it
            await trio.sleep(WARM_AFTER)
            with trio.move_on_after(WARM_WAIT):
                while store.catalog().checking():
                    await trio.sleep(WARM_POLL)
            while True:
                try:  # (the store catalog's first build may fail: its file locked by another process too long)
                    names = await trio.to_thread.run_sync(idle, warm, None, abandon_on_cancel=True)  # (a build elsewhere: minutes)
                    break
                except Exception:
                    log.exception("loading the search index failed; tried again in %.0f s", WARM_RETRY)
                    await trio.sleep(WARM_RETRY)
            ops.warm_pending = len(names)
            for name in names:
                try:  # one session per thread call: shutdown need not wait for the rest
                    await trio.to_thread.run_sync(idle, warm, [name])
                except Exception:
                    log.exception("session %s: warming the search index failed", name)
                ops.warm_pending -= 1
            while True:
                try:
                    delay = await trio.to_thread.run_sync(idle, maintain)
                except Exception:  # never the mount's end; tried again later
                    log.exception("keeping the search index failed")
                    delay = 5.0
                await trio.sleep(delay)

        nursery.start_soon(stop_on_signal)
        ops.pacer.watch()  # (this thread is the event loop's)
        nursery.start_soon(keep_search_index)
        ops.durability = Durability()
        nursery.start_soon(ops.durability.run)
        nursery.start_soon(ops.gate.run)
        if ops.cluster is not None:  # the follower and the fast path: a NATS connection on this loop
            from memfs.cluster.follow import Follower
            from memfs.cluster.wire import Connection

            ops.nats = Connection(ops.cluster.config.servers, name=f"memfs {ops.cluster.host_id} (event loop)",
                                  auth=ops.cluster.auth)
            Follower(ops.nats, ops.cluster)
            nursery.start_soon(ops.nats.run)
        try:
            await pyfuse3.main(min_tasks=MIN_TASKS, max_tasks=MAX_TASKS)
        finally:
            ops.pacer.close()  # unmounting: background work no longer gives way
            nursery.cancel_scope.cancel()
    ops.durability.close()  # (a session's last release already made it durable)
    ops.durability = ops.nats = None


def run(config) -> int:
    """Mount and serve until unmounted or signalled; return an exit status."""
    logging.basicConfig(level=getattr(logging, str(config.log_level).upper(), logging.INFO),
                        format="memfs[%(process)d] %(levelname)s %(message)s")
    if config.cluster.enabled:  # no NATS credential shown: not in a log, nor in ps (SPEC §9)
        from memfs.cluster.auth import hide_argv_secrets, redact_logs

        redact_logs()
        hide_argv_secrets()
    mountpoint = Path(os.path.abspath(Path(config.mountpoint).expanduser()))
    _check_mountpoint(mountpoint)
    mountpoint = Path(os.path.realpath(mountpoint))  # resolved now: once mounted, no lookups of our own tree
    raise_fd_limit()
    # The event loop shares the GIL with the worker threads doing disk work (cap rewrites,
    # rescans): a shorter switch interval bounds how long a request waits for it (5 ms by default).
    sys.setswitchinterval(SWITCH_INTERVAL)
    lower_workers()  # worker threads below the event loop (memfs/pace.py)
    ready_w = None
    if config.daemon:
        # the server opens the store after the fork: no session lock, catalog connection or
        # thread of the parent's crosses it (SPEC §3.5; SQLite's locks are per process)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid:
            os.close(ready_w)
            with os.fdopen(ready_r, "rb") as ready:
                answer = ready.read()  # "1" once the mount is up, else "0" and why (EOF either way)
            if answer == b"1":
                print(pid, flush=True)
                return 0
            raise MemfsError(answer[1:].decode(errors="replace") or "the daemon failed to start")
        os.close(ready_r)
        os.setsid()
    store = ops = None
    try:
        store, ops = build(config)
        if config.cluster.enabled:  # after the fork: the NATS thread must live in the server
            ops.cluster = start_cluster(config, store)
        pyfuse3.init(ops, str(mountpoint), fuse_options(config, store.root))
        fd = fuse_device_fd()
        if fd is not None:
            _last_close(fd)
            ops.gate.queued = requests_waiting(fd)
    except BaseException:
        if ops is not None and ops.cluster is not None:
            ops.cluster.stop()
        if store is not None:
            store.close()
        if ready_w is not None:
            why = sys.exc_info()[1]
            os.write(ready_w, b"0" + (str(why) if isinstance(why, (MemfsError, OSError)) else repr(why)).encode())
            os._exit(1)
        raise
    log_file = None
    if ready_w is not None:
        log_file = _detach_stdio(mountpoint)
        os.write(ready_w, b"1")
        os.close(ready_w)
    what = f"session {config.session} of {store.root}" if config.session else str(store.root)
    log.info("serving %s at %s%s", what, mountpoint, " (read-only)" if config.read_only else "")
    record = registry.register(str(mountpoint), {
        "mountpoint": str(mountpoint), "store": os.path.abspath(store.root), "pid": os.getpid(),
        "log": str(log_file) if log_file else None, "session": config.session, "read_only": config.read_only,
        "cluster": config.cluster.stream if config.cluster.enabled else None})
    _keep_shutdown_whole()
    helper = RescanHelper()  # a request's rescan of a large log runs off the GIL
    rescanner.use(helper)
    try:
        trio.run(_serve, store, ops)
    finally:
        try:
            try:
                views.flush()  # views copied to the backing store are written before we go
                ops.close_files()  # files the kernel did not release yet hold sessions open
                if ops.cluster is not None:
                    ops.cluster.stop()  # nothing is applied after the store is closed
                close_search = getattr(ops.searcher, "close", None)
                if close_search is not None:
                    close_search()  # the search index saved in the store, if it changed
            finally:
                store.close()  # every session flushed, persisted and unlocked, whatever happened above
        finally:
            rescanner.use(None)
            helper.close()
            pyfuse3.close(unmount=True)
            registry.unregister(record)
    log.info("unmounted %s", mountpoint)
    if ready_w is not None:
        os._exit(0)
    return 0


def start_cluster(config, store: Store):
    """Join the cluster (SPEC §9): connect, make sure the stream exists, start following. Only
    here is :mod:`memfs.cluster.node` (and ``nats``) imported."""
    try:
        from memfs.cluster.node import ClusterNode
    except ImportError as exc:
        raise MemfsError(f"cluster mode needs the cluster extra: pip install 'memfs[cluster]' ({exc})") from None
    from memfs.cluster import redact
    from memfs.cluster.auth import Refused

    servers = redact(",".join(config.cluster.servers))
    try:
        node = ClusterNode(store, config.cluster).start()
    except (Refused, ConfigError) as exc:  # a refused credential, TLS, a bad secret file: said as is
        raise MemfsError(f"cannot join the cluster: {exc}") from None
    except Exception as exc:
        raise MemfsError(f"cannot join the cluster at {servers}: {redact(repr(exc))}") from None
    log.info("cluster: %s, stream %s, replicas %d, host id %s", servers,
             config.cluster.stream, config.cluster.effective_replicas, node.host_id)
    return node


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


def _check_mountpoint(mountpoint: Path) -> None:
    """Refuse a path that is already a memfs mount (stacking one on another hides the first);
    create a missing mountpoint whose parent exists (as ``mkdir`` would, one level only)."""
    existing = registry.memfs_mount_at(mountpoint)
    if existing is not None:
        raise MemfsError(f"{mountpoint} is already a memfs mount (store {existing['store'] or '?'}); "
                         f"unmount it first: memfs umount {mountpoint}")
    if not os.path.lexists(mountpoint) and mountpoint.parent.is_dir():
        try:
            mountpoint.mkdir(mode=0o755)
            log.info("created the mountpoint %s", mountpoint)
        except FileExistsError:
            pass
        except OSError as exc:
            raise MemfsError(f"cannot create the mountpoint {mountpoint}: {exc.strerror}") from None
    if not mountpoint.is_dir():
        if not mountpoint.parent.is_dir():
            raise MemfsError(f"mountpoint {mountpoint} does not exist, nor does its parent {mountpoint.parent}")
        raise MemfsError(f"mountpoint {mountpoint} is not a directory")


def daemon_log_path(mountpoint: str | os.PathLike) -> Path:
    """Where the daemon serving ``mountpoint`` logs (one file per mount, see
    :mod:`memfs.fs.registry`)."""
    return registry.log_path(mountpoint)


def _detach_stdio(mountpoint: Path) -> Path:
    """A daemon keeps no terminal or pipe open (whoever started it may wait for EOF); its log
    goes to :func:`daemon_log_path`, which is returned."""
    path = daemon_log_path(mountpoint)
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
    return path


UMOUNT_WAIT = 60.0  # seconds memfs umount waits for the server to finish its flush and exit


def unmount(mountpoint: str | os.PathLike, lazy: bool = False) -> int:
    """Unmount a memfs mount (``fusermount3 -u``, ``-z`` when ``lazy``) and return once its
    server has flushed, released its locks and exited (not waited for with ``lazy``). A
    failure is one line on stderr saying what is wrong and what to do."""
    target = os.path.abspath(os.path.expanduser(mountpoint))
    if registry.memfs_mount_at(target) is None:
        if not os.path.exists(target):
            print(f"memfs: {target} does not exist", file=sys.stderr)
        elif os.path.ismount(target):
            print(f"memfs: {target} is not a memfs mount (see memfs mounts); use umount for others",
                  file=sys.stderr)
        else:
            print(f"memfs: {target} is not mounted (memfs mounts lists the memfs mounts)", file=sys.stderr)
        return 1
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    if tool is None:
        print("memfs: fusermount3 not found (install fuse3)", file=sys.stderr)
        return 1
    servers = [m["pid"] for m in registry.memfs_mounts()
               if m["pid"] and m["mountpoint"] in (target, os.path.realpath(target))]
    result = subprocess.run([tool, "-u", *(["-z"] if lazy else []), target], capture_output=True, text=True)
    if result.returncode:
        raw = result.stderr.strip()
        if "busy" in raw.lower():
            print(f"memfs: {target} is busy: a process has a file open or its working directory in it "
                  f"(see: fuser -vm {target}); close it, or detach now with: memfs umount --lazy {target}",
                  file=sys.stderr)
        elif "permitted" in raw.lower() or "permission" in raw.lower():
            print(f"memfs: not allowed to unmount {target}: it was mounted by another user", file=sys.stderr)
        else:
            print(f"memfs: cannot unmount {target}: {raw.splitlines()[-1] if raw else 'fusermount3 failed'}",
                  file=sys.stderr)
        return 1
    if lazy:  # the server goes once the last user of the mount is gone: nothing to wait for here
        return 0
    # return once the server has flushed, persisted and released its locks (SPEC §3.5): a
    # handoff right after memfs umount must not race it
    deadline = time.monotonic() + UMOUNT_WAIT
    for pid in servers:
        while pid_alive(pid):
            if time.monotonic() > deadline:
                print(f"memfs: {target} is unmounted, but its server (pid {pid}) has not exited after "
                      f"{UMOUNT_WAIT:.0f} s: it may still be flushing (see memfs mounts)", file=sys.stderr)
                return 1
            time.sleep(0.02)
    return 0
