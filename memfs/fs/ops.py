"""The pyfuse3 operations: each handler maps one request onto the library (SPEC §6).

Translation only: the append semantics live in :mod:`memfs.store.appender`, sessions in
:mod:`memfs.store.root`, views in :mod:`memfs.views`, search in :mod:`memfs.search`; errno
numbers in :mod:`memfs.fs.errors`. Every handler runs under :func:`guarded`.

Decisions recorded here:

* ``events.jsonl`` is opened with ``direct_io``: short writes reach the writer, and reads
  always see the log as it is. Generated files are snapshots taken at ``open``, also
  ``direct_io``, so tools read them whole.
* A pending fragment is validated at ``flush`` (each ``close()``), so the closing process
  sees ``EBADMSG``; ``release`` only cleans up. When the log cannot take the fragment
  (``ENOSPC``), that ``close()`` fails and the fragment stays with the handle: a later
  ``close()`` of a duplicate of the descriptor tries again, but ``release`` drops it (logged)
  — the writer was told it failed, and a line reported as failed is never appended later.
  A fragment ``release`` finds without a failed ``flush`` before it is committed there.
* ``touch`` (time-only ``setattr``) is accepted and ignored; size, mode and owner changes
  are ``EPERM``.
* The reason of the session's last refused line (in this server) is readable as the
  ``user.memfs.last_error`` attribute of the session folder and of its ``events.jsonl``
  (``getfattr -n user.memfs.last_error sessions/s``).
"""

from __future__ import annotations

import functools
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import pyfuse3
import trio

from memfs import views
from memfs.errors import MemfsError, NotFound, ValidationError
from memfs.fs import content
from memfs.fs.errors import fail, guarded, log
from memfs.fs.gate import WriteGate
from memfs.fs.nodes import (BACKING_FILES, DIR_KINDS, DYNAMIC_KINDS, INDEX_CHILDREN, SESSION_CHILDREN, InodeTable,
                            K, Node, child)
from memfs.pace import Pacer, as_worker
from memfs.store import rescanner
from memfs.store.appender import LineAppender
from memfs.store.meta import parse_rfc3339
from memfs.store.paths import open_nofollow, refuse_symlink
from memfs.store.session import LogReader, SessionHandle
from memfs.store.root import Store

# Seconds the kernel may cache: names that never change vs. anything that does.
STATIC_TIMEOUT = 60.0
ENTRY_TIMEOUT = 1.0
# Generated in a worker thread when the views must refresh first (a first render of a large
# session can take a while, and the trio loop must keep serving); a current view, and every
# other generated file, is cheaper to serve inline than the thread hop (~0.4 ms here).
SLOW_KINDS = frozenset({K.VIEW, K.TURN})
SEARCH_TIMEOUT = 10.0  # seconds a search may take before the open fails with ETIMEDOUT
# A session's metadata files, cached by the kernel for one clock tick while nothing in this
# mount writes the session (see Operations._attr_timeout): the kernel rounds the timeout up
# to a tick, and keeps the attributes until the tick after.
TICKED_KINDS = frozenset({K.MANIFEST, K.TURNS_JSON})
ATTR_TICK = 0.001
TICK_HOLD = 0.1  # seconds after which a ticked reply surely expired (HZ ≥ 100: ≤ 20 ms)

# searcher(query, session or None for all, k or None, min_score or None) -> results
Searcher = Callable[[str, "str | None", "int | None", "float | None"], list]


@dataclass
class MountOptions:
    """What the operations need to know about the mount."""

    single_session: str | None = None
    read_only: bool = False
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)


@dataclass
class OpenFile:
    """One open file handle."""

    node: Node
    snapshot: bytes | None = None
    session: SessionHandle | None = None
    appender: LineAppender | None = None
    append_mode: bool = False
    # Without O_APPEND: where this handle's next write() is expected (SPEC §6): the offset its
    # own writes reached (they count what the writer wrote, not the longer stored line of a
    # wrapped bare event), else the log's length when it was opened. The log's current end
    # (pwrite there, a seek to the end) is always accepted too.
    next_off: int = -1
    fd: int = -1  # a backing file read in place (BACKING_FILES), closed at release
    reader: LogReader | None = None  # events.jsonl: the version it opened (SPEC §3.7), closed at release
    writing: bool = False  # the session handle claims to be writing (SessionHandle.claim_writing)
    close_failed: bool = False  # a flush could not commit the fragment: release drops it


class Operations(pyfuse3.Operations):
    """memfs as a pyfuse3 filesystem over a :class:`Store`."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, store: Store, options: MountOptions, searcher: Searcher | None = None):
        super().__init__()
        self.store = store
        self.opts = options
        self.searcher = searcher
        root = Node(K.SESSION, options.single_session) if options.single_session else Node(K.ROOT)
        self.inodes = InodeTable(root)
        self.files: dict[int, OpenFile] = {}
        self.dirs: dict[int, list[tuple[str, Node]]] = {}
        self._next_fh = 1
        self.started = time.time_ns()
        self.cluster = None  # a memfs.cluster.node.ClusterNode in cluster mode (SPEC §9), set before mounting
        self.nats = None  # with it, a memfs.cluster.wire.Connection: the event loop's own NATS connection
        self.durability = None  # a memfs.fs.syncer.Durability while mounted: fsync mode's waits
        self.gate = WriteGate()  # appends give way to queued requests (its queue poll is set at mount)
        self.reader = None  # the RequestReader pyfuse3's tasks wait in (memfs.fs.reader; set at mount)
        self.pacer = Pacer()  # background work gives way to the loop (it watches the loop at mount)
        self.warm_pending = None  # sessions the search index's warm-up has still to index (once listed)
        self._mtimes: dict[Node, tuple[tuple[int, int], int]] = {}  # generated file → (content key, mtime)
        self._ticked: dict[str, dict[int, float]] = {}  # session → {inode: when its attributes were ticked}
        self._tick_swept = 0.0  # when _ticked was last swept of expired ticks (_attr_timeout)
        self._tick_lock = threading.Lock()  # (a file opened for writing on a worker thread unticks)
        self.attr_ticked = 0  # replies that carried ATTR_TICK (the root's user.memfs.attr_ticked)
        self.attr_unticked = 0  # of them, withdrawn before they expired (user.memfs.attr_unticked)

    # --- helpers -----------------------------------------------------------------------------

    def _node(self, inode: int) -> Node:
        node = self.inodes.node(inode)
        if node is None:
            raise fail("ENOENT")
        return node

    def _session(self, node: Node) -> SessionHandle:
        return self.store.held(node.session) or self.store.open(node.session)

    def _inline(self, node: Node) -> bool:
        """Whether a request about ``node`` can be served on the event loop: it belongs to no
        session, or its session is held open and no other thread holds it busy (a cap rewrite,
        an append waiting for its lock). Otherwise the request runs on a worker thread, where
        opening the session (a rescan, maybe) or waiting for it blocks nobody else (SPEC §6)."""
        name = node.session
        if name is None:
            return True
        handle = self.store.held(name)
        return handle is not None and handle.free()

    async def _served(self, node: Node, fn: Callable, *args):
        """``fn(*args)``, inline when :meth:`_inline` says so, else on a worker thread."""
        self.gate.note_other()
        if self._inline(node):
            return fn(*args)
        return await self._off_loop(fn, *args)

    async def _off_loop(self, fn: Callable, *args):
        """``fn(*args)`` on a worker thread, the calling task waiting (not cancellable: a
        started append or persist always completes and its result is the reply). A lighter hop
        than ``trio.to_thread.run_sync`` — no capacity limiter, no thread renaming, no context
        copy — for the requests that must wait for the disk (a ``fsync``-mode append is one
        such hop per ``write()``). The number of threads is bounded by pyfuse3's
        ``max_tasks``. While a request is served this way, background work does not give way
        to the loop (:mod:`memfs.pace`: the request may be waiting for it)."""
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()

        def deliver(result) -> None:
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        with self.pacer.hop():
            trio.lowlevel.start_thread_soon(functools.partial(as_worker, fn, *args), deliver)
            return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    def _versioned(self, node: Node) -> Node:
        """``events.jsonl`` is a new file in the mount whenever the log is replaced (SPEC §3.7: a
        cap rewrite): its node, hence its inode number, names the log's generation, so
        ``tail -F`` sees the name point to a new file and reopens it."""
        if node.kind is not K.EVENTS:
            return node
        serial, rewrites = self._session(node).generation
        return Node(K.EVENTS, node.session, f"{serial}.{rewrites}")

    def session_of(self, handler: str, args: tuple) -> str | None:
        """The session a request (``handler`` with its arguments) is about, for log lines."""
        if handler in ("read", "write", "flush", "fsync"):
            handle = self.files.get(args[0])
            return handle.node.session if handle is not None else None
        if handler in ("mkdir", "rmdir"):
            return os.fsdecode(args[1])
        node = self.inodes.node(args[0])
        if node is None:
            return None
        if handler == "lookup" and node.kind is K.SESSIONS:
            return os.fsdecode(args[1])
        return node.session or self.opts.single_session

    def _refuse_change(self) -> pyfuse3.FUSEError:
        return fail("EROFS" if self.opts.read_only else "EPERM")

    def _exists(self, node: Node) -> bool:
        """Whether a node found by shape exists now."""
        kind = node.kind
        if node.session is not None and not self.store.exists(node.session):
            return False
        if kind is K.VIEW:  # the fixed views exist without listing derived/ at every stat
            return content.is_view_name(node.arg) or node.arg in content.view_names(self._session(node))
        if kind is K.TURN:
            return int(node.arg) in content.turn_numbers(self._session(node))
        if kind is K.QUERY:
            return content.parse_query(node.arg) is not None
        if kind is K.IMPORT_SOURCES:
            return refuse_symlink(self._backing(node)) is not None
        return True

    def _backing(self, node: Node):
        """The store's file a :data:`BACKING_FILES` node serves."""
        return self.store.root / node.session / BACKING_FILES[node.kind]

    def _content(self, node: Node) -> bytes:
        """The bytes of a generated file as they are now."""
        kind = node.kind
        if kind is K.README:
            return content.SINGLE_README if self.opts.single_session else content.README
        session = self._session(node)
        if kind is K.MANIFEST:
            return session.manifest_json()
        if kind is K.TURNS_JSON:
            return session.turn_index_json()
        if kind is K.VIEW:
            return content.view_bytes(session, node.arg)
        if kind is K.TURN:
            return content.view_bytes(session, f"turns/{node.arg}.jsonl")
        raise NotFound(f"not a generated file: {kind}")

    async def _query_bytes(self, node: Node) -> bytes:
        query = content.parse_query(node.arg)
        if query is None or self.searcher is None:
            raise fail("ENOENT")
        with trio.move_on_after(SEARCH_TIMEOUT) as scope:
            with self.pacer.hop():  # (as in _off_loop; abandoned at the timeout)
                results = await trio.to_thread.run_sync(as_worker, self.searcher, query.text, node.session, query.k,
                                                        query.min_score, abandon_on_cancel=True)
        if scope.cancelled_caught:
            raise fail("ETIMEDOUT")
        return content.render_results(results, query.format)

    def _size(self, node: Node) -> tuple[int, int]:
        """``(size, mtime_ns)`` of a node now (SPEC §6: times are real)."""
        kind = node.kind
        if kind is K.EVENTS:
            session = self._session(node)
            if node.arg is not None and node.arg != "%d.%d" % session.generation:
                for handle in list(self.files.values()):  # an old version, kept by its readers
                    if handle.node == node and handle.reader is not None and handle.reader.fd is not None:
                        st = os.fstat(handle.reader.fd)
                        return st.st_size, st.st_mtime_ns
            return session.file_len, self._file_mtime(session.path / "events.jsonl")
        if kind in BACKING_FILES:
            st = refuse_symlink(self._backing(node))  # ELOOP, as its open: not the size of a link planted there
            return (st.st_size, st.st_mtime_ns) if st is not None else (0, self.started)
        if kind is K.SESSION:
            try:  # a session that cannot be opened (a planted link) is still listed, as before
                updated = self._session(node).manifest["updated_at"]
            except (MemfsError, OSError):
                return 0, self.started
            return 0, _rfc3339_ns(updated, self.started)
        if kind in DYNAMIC_KINDS and kind is not K.QUERY and kind is not K.README:
            data = self._content(node)
            return len(data), self._content_mtime(node, data)
        if kind is K.README:
            return len(self._content(node)), self.started
        return 0, self.started

    def _file_mtime(self, path) -> int:
        try:
            return os.stat(path, follow_symlinks=False).st_mtime_ns
        except OSError:
            return self.started

    def _content_mtime(self, node: Node, data: bytes) -> int:
        """When a generated file's content last changed: the log's mtime when this server
        first saw it, or when it saw it change (so ``ls -lt`` sorts by recency and a second
        ``rsync -a`` finds nothing new)."""
        key = (len(data), hash(data))
        seen = self._mtimes.get(node)
        if seen is not None and seen[0] == key:
            return seen[1]
        mtime = self._file_mtime(self.store.root / node.session / "events.jsonl")
        if seen is not None:
            mtime = max(mtime, seen[1] + 1)
        self._mtimes[node] = (key, mtime)
        return mtime

    async def _attr(self, node: Node, inode: int | None = None) -> pyfuse3.EntryAttributes:
        kind = node.kind
        if kind is K.QUERY:
            size, mtime = len(await self._query_bytes(node)), time.time_ns()
        elif not self._inline(node) or (kind in SLOW_KINDS and not views.is_current(self._session(node))):
            size, mtime = await self._off_loop(self._size, node)
        else:
            size, mtime = self._size(node)
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode if inode is not None else self.inodes.inode(node)  # after the size: no inode for a failure
        attr.st_size = size
        writable = not self.opts.read_only
        if kind in DIR_KINDS:
            attr.st_mode = stat.S_IFDIR | (0o755 if writable and kind in (K.SESSIONS, K.SESSION) else 0o555)
            attr.st_nlink = 2
        else:
            attr.st_mode = stat.S_IFREG | (0o644 if writable and kind is K.EVENTS else 0o444)
            attr.st_nlink = 1
        attr.st_blksize = 4096
        attr.st_blocks = (size + 511) // 512
        attr.st_uid, attr.st_gid = self.opts.uid, self.opts.gid
        attr.st_atime_ns = attr.st_ctime_ns = self.started
        # Real times (SPEC §6): the log's last append, the session's updated_at, a generated
        # file's last change; other directories and README.md: when the mount started.
        attr.st_mtime_ns = mtime
        static = kind in (K.ROOT, K.README, K.SESSIONS, K.INDEX, K.SEARCH) or (
            kind is K.SESSION and self.opts.single_session)
        if static:
            attr.attr_timeout = attr.entry_timeout = STATIC_TIMEOUT
        elif kind in DIR_KINDS:
            attr.attr_timeout = attr.entry_timeout = ENTRY_TIMEOUT
        else:
            attr.attr_timeout = self._attr_timeout(node, attr.st_ino) if kind in TICKED_KINDS else 0
            attr.entry_timeout = 0 if kind is K.QUERY else ENTRY_TIMEOUT
        return attr

    def _attr_timeout(self, node: Node, inode: int) -> float:
        """The attribute timeout of a session's ``manifest.json`` or ``index/turns.json``.

        ``stat`` must report the size of the current content (SPEC §6), and with a timeout of 0
        every ``stat``, ``open`` (its permission check) and ``fstat`` asks this server: three
        GETATTRs — each generating the file — in the seven round trips of ``stat f; cat f``.
        Their content changes only when the session does, so while no file of the session is
        open for writing in this mount the reply carries :data:`ATTR_TICK`, which the kernel
        keeps until the next tick but one (HZ 250: 4–8 ms): one GETATTR per ``stat; cat``.
        Opening ``events.jsonl`` for writing withdraws it first (:meth:`_untick`: the
        kernel forgets those attributes), so every change made through this mount shows at
        the next ``stat``; a change by another process (a library writer, ``memfs import``)
        shows within that tick, as the spec's "short" timeouts allow. Side by side, ``stat``
        + ``cat`` of an idle session's manifest while 4 writers drive other sessions through
        cap rewrites (``bench_responsive.py`` (a)): see ``bench/REPORT.md``. Not in cluster
        mode, where a replica's appends change sessions without a file opened here.

        A tick is remembered only while the kernel may still hold it: at most every
        :data:`TICK_HOLD` seconds, when a tick is given, the ticks older than that are
        dropped: what is held is the sessions ticked within two such periods of the latest
        tick, not every session ever ``stat``'d (the root's ``user.memfs.attr_tick_sessions``
        counts them)."""
        if self.cluster is not None:
            return 0
        name = node.session
        with self._tick_lock:
            held = self.store.held(name)
            if held is not None and held.writers:
                return 0
            now = time.monotonic()
            if now - self._tick_swept > TICK_HOLD:
                self._sweep_ticks(now - TICK_HOLD)
                self._tick_swept = now
            self._ticked.setdefault(name, {})[inode] = now
            self.attr_ticked += 1
        return ATTR_TICK

    def _sweep_ticks(self, expired: float) -> None:
        """Forget the ticks given before ``expired`` (caller holds ``_tick_lock``): the kernel
        no longer holds them, so :meth:`_untick` would skip them anyway."""
        for name in list(self._ticked):
            inodes = self._ticked[name]
            for inode in [inode for inode, when in inodes.items() if when <= expired]:
                del inodes[inode]
            if not inodes:
                del self._ticked[name]

    def _untick(self, name: str) -> None:
        """The kernel forgets the ticked attributes of session ``name`` (see :meth:`_attr_timeout`)."""
        with self._tick_lock:
            ticked = self._ticked.pop(name, None)
            if not ticked:
                return
            recent = time.monotonic() - TICK_HOLD
            inodes = [inode for inode, when in ticked.items() if when > recent]
            self.attr_unticked += len(inodes)
        for inode in inodes:
            try:
                pyfuse3.invalidate_inode(inode, attr_only=True)
            except OSError:  # (ENOENT: the kernel has forgotten the inode already)
                pass

    # --- names -------------------------------------------------------------------------------

    @guarded
    async def lookup(self, parent_inode, name, ctx=None):
        parent = self._node(parent_inode)
        node = child(parent, os.fsdecode(name), self.opts.single_session is not None)
        if node is None or not await self._served(node, self._exists, node):
            raise fail("ENOENT")
        if node.kind is K.EVENTS:
            node = await self._served(node, self._versioned, node)
        attr = await self._attr(node)
        self.inodes.remember(attr.st_ino)
        return attr

    @guarded
    async def getattr(self, inode, ctx=None):
        node = self._node(inode)
        if not await self._served(node, self._exists, node):
            raise fail("ENOENT")
        return await self._attr(node, inode)

    async def forget(self, inode_list):
        for inode, n in inode_list:
            self.inodes.forget(inode, n)

    @guarded
    async def setattr(self, inode, attr, fields, fh, ctx):
        node = self._node(inode)
        if self.opts.read_only or fields.update_size or fields.update_mode or \
                fields.update_uid or fields.update_gid:
            raise self._refuse_change()
        return await self._attr(node, inode)

    # --- directories -------------------------------------------------------------------------

    def _listing(self, node: Node) -> list[tuple[str, Node]]:
        kind = node.kind
        if kind is K.ROOT:
            names = ["README.md", "sessions", "search"]
        elif kind is K.SESSIONS:
            names = self.store.names()
        elif kind is K.SESSION:
            names = (["README.md"] if self.opts.single_session else []) + list(SESSION_CHILDREN)
        elif kind is K.INDEX:
            names = [name for name, sub in INDEX_CHILDREN.items() if self._exists(Node(sub, node.session))]
        elif kind is K.DERIVED:
            names = content.view_names(self._session(node)) + ["turns"]
        elif kind is K.TURNS:
            names = [f"{n}.jsonl" for n in content.turn_numbers(self._session(node))]
        else:  # search/: queries are not listed
            names = []
        single = self.opts.single_session is not None
        return [(name, self._versioned(child(node, name, single))) for name in names]

    @guarded
    async def opendir(self, inode, ctx):
        node = self._node(inode)
        if node.kind not in DIR_KINDS:
            raise fail("ENOTDIR")
        fh = self._new_fh()
        self.dirs[fh] = await self._off_loop(self._listing, node)
        return fh

    @guarded
    async def readdir(self, fh, start_id, token):
        entries = self.dirs[fh]
        for i in range(start_id, len(entries)):
            name, node = entries[i]
            try:
                attr = await self._attr(node)
            except (MemfsError, OSError):
                continue  # vanished since opendir
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attr, i + 1):
                break
            self.inodes.remember(attr.st_ino)

    async def releasedir(self, fh):
        self.dirs.pop(fh, None)

    def _session_entry(self, parent_inode: int, name: bytes) -> str:
        """The session name for mkdir/rmdir: only directly under ``sessions/``."""
        parent = self._node(parent_inode)
        if self.opts.read_only:
            raise fail("EROFS")
        if parent.kind is not K.SESSIONS:
            raise fail("EPERM")
        return os.fsdecode(name)

    @guarded
    async def mkdir(self, parent_inode, name, mode, ctx):
        session = self._session_entry(parent_inode, name)
        await self._off_loop(self.store.create, session)
        attr = await self._attr(Node(K.SESSION, session))
        self.inodes.remember(attr.st_ino)
        return attr

    @guarded
    async def rmdir(self, parent_inode, name, ctx):
        session = self._session_entry(parent_inode, name)
        await self._off_loop(self.store.remove, session)
        self._untick(session)
        self.inodes.drop_session(session)
        views.forget(self.store.root / session)
        for node in [n for n in self._mtimes if n.session == session]:
            del self._mtimes[node]

    # --- refused changes -----------------------------------------------------------------------

    @guarded
    async def unlink(self, parent_inode, name, ctx):
        raise self._refuse_change()

    @guarded
    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
        raise self._refuse_change()

    @guarded
    async def link(self, inode, new_parent_inode, new_name, ctx):
        raise self._refuse_change()

    @guarded
    async def symlink(self, parent_inode, name, target, ctx):
        raise self._refuse_change()

    @guarded
    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        raise self._refuse_change()

    @guarded
    async def create(self, parent_inode, name, mode, flags, ctx):
        raise self._refuse_change()

    @guarded
    async def setxattr(self, inode, name, value, ctx):
        raise self._refuse_change()

    @guarded
    async def removexattr(self, inode, name, ctx):
        raise self._refuse_change()

    # --- files -------------------------------------------------------------------------------

    def _new_fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    @guarded
    async def open(self, inode, flags, ctx):
        node = self._node(inode)
        if node.kind in DIR_KINDS:
            raise fail("EISDIR")
        if not await self._served(node, self._exists, node):
            raise fail("ENOENT")
        writing = flags & os.O_ACCMODE != os.O_RDONLY
        if flags & os.O_TRUNC or (writing and node.kind is not K.EVENTS):
            raise self._refuse_change()
        handle = OpenFile(node)
        if node.kind is K.EVENTS:
            await self._served(node, self._open_events, handle, writing, flags, ctx.pid)
        elif node.kind in BACKING_FILES:  # streamed from an fd: never copied whole into memory
            try:
                handle.fd = open_nofollow(self._backing(node), os.O_RDONLY)
            except FileNotFoundError:
                handle.snapshot = b""
        elif node.kind is K.QUERY:
            handle.snapshot = await self._query_bytes(node)
        else:
            slow = not self._inline(node) or (node.kind in SLOW_KINDS and not views.is_current(self._session(node)))
            handle.snapshot = await self._off_loop(self._content, node) if slow else self._content(node)
            if node.kind is not K.README:
                self._content_mtime(node, handle.snapshot)
        fh = self._new_fh()
        self.files[fh] = handle
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)

    def _open_events(self, handle: OpenFile, writing: bool, flags: int, pid: int) -> None:
        """Open ``events.jsonl`` (inline or on a worker thread, see :meth:`_served`)."""
        node = handle.node
        if writing and (self.opts.read_only or self._session(node).read_only):
            raise fail("EROFS")
        session = handle.session = self.store.share(node.session)  # its own: the store may close its handle
        try:
            handle.reader = session.reader()  # keeps its version across cap rewrites (SPEC §3.7)
            if writing:
                session.claim_writing()  # the lock, once taken, stays while this file is open
                handle.writing = True
                self._untick(session.name)  # (after the claim: no new tick from now on)
                target, limit, limit_name = session, self.store.settings.max_line_bytes, "max_line_bytes"
                if self.cluster is not None:  # publish with the fence first, then the local commit
                    target = self.cluster.session(session)
                    if self.cluster.max_line < limit:  # a longer line, refused at once (no publish)
                        limit, limit_name = self.cluster.max_line, self.cluster.limit_name
                # fsync mode: the loop commits, the syncer syncs (memfs.fs.syncer)
                deferred = self.durability is not None and self.cluster is None and session.durability == "fsync"
                handle.appender = LineAppender(target, max_line_bytes=limit, pid=pid, sync=not deferred,
                                               limit_name=limit_name)
                handle.append_mode = bool(flags & os.O_APPEND)
                handle.next_off = session.file_len
        except BaseException:
            self._release(handle)
            raise

    @guarded
    async def read(self, fh, off, size):
        handle = self.files[fh]
        if handle.snapshot is not None:
            return handle.snapshot[off : off + size]
        if handle.fd >= 0:
            return os.pread(handle.fd, size, off)
        reader = handle.reader
        if reader.may_block():  # bytes to write first, the end to learn from disk, a busy session
            return await self._off_loop(reader.read, off, size)
        return reader.read(off, size)

    @guarded
    def write(self, fh, off, buf):  # plain, not async: see guarded()
        handle = self.files[fh]
        appender = handle.appender
        if appender is None:
            raise fail("EBADF")
        # the store says when an append may wait for the disk (fsync, a cap rewrite, taking
        # the lock, a busy session): then a worker thread waits, never the event loop (SPEC §6);
        # in cluster mode every append waits for JetStream's ack, also on a worker thread
        if not appender.sync:
            return self._write_synced(handle, off, buf)
        if self.cluster is not None:
            if not appender.partial and buf.find(b"\n") == len(buf) - 1 and (
                    handle.append_mode or off == handle.next_off):
                return self._write_published(handle, off, buf)
            return self._off_loop(self._write, handle, off, buf)
        if self.gate.busy():  # other requests wait: they go first (memfs.fs.gate)
            return self._write_in_turn(handle, off, buf)
        n = self._write_unless_blocking(handle, off, buf)
        return self._off_loop(self._write, handle, off, buf) if n is None else n

    async def _write_in_turn(self, handle: OpenFile, off: int, buf: bytes) -> int:
        n = await self.gate.turn(self._write_unless_blocking, handle, off, buf)
        return await self._off_loop(self._write, handle, off, buf) if n is None else n

    def _write_unless_blocking(self, handle: OpenFile, off: int, buf: bytes) -> int | None:
        """The append on the event loop, or None when it may wait for the disk (then it goes
        to a worker thread)."""
        if handle.session.may_block_append(len(buf), buf.count(b"\n") + 1):
            return None
        return self._write(handle, off, buf)

    async def _write_published(self, handle: OpenFile, off: int, buf: bytes) -> int:
        """Cluster mode, one whole line in one ``write()`` (the usual agent's append): publish
        it on this loop's own NATS connection (:mod:`memfs.cluster.wire`) and commit it as soon
        as the acknowledgement is read — before the stream's delivery of it to this host's
        follower, which then skips it — with no other thread involved. Anything unusual (no
        connection, the session held by the applier or another writer, a line to refuse, a
        commit that may block, a fence refusal, a timeout) takes the worker-thread path, which
        handles it as every append did before."""
        session, cluster, nats = handle.session, self.cluster, self.nats
        line = buf[:-1]
        rep = None
        if nats is not None and nats.ready and len(buf) <= cluster.max_line \
                and not session.may_block_append(len(buf), 1):  # (a longer line: refused on the worker path)
            rep = cluster.claim_fast(session.name)
        if rep is not None:
            try:  # under the replica's lock: against the state the fence names
                record = session.validate(line)
            except ValidationError:  # refused: the worker path records and reports it
                cluster.finish_fast(rep, session, None, None)
                rep = None
        if rep is None:
            return await self._off_loop(self._write, handle, off, buf)
        answered = False

        def commit(ack) -> bool:  # on the connection's receive loop, as soon as the reply is read
            nonlocal answered
            answered = True
            return cluster.finish_fast(rep, session, record, ack)

        try:
            committed = await nats.request(*cluster.fast_request(rep, record[0]), on_reply=commit)
        finally:
            if not answered:  # no reply in time, no connection, or cancelled: only release
                cluster.finish_fast(rep, session, record, None)
        if not committed:
            return await self._off_loop(self._write, handle, off, buf)
        handle.next_off = off + len(buf)
        return len(buf)

    async def _write_synced(self, handle: OpenFile, off: int, buf: bytes) -> int:
        """An ``fsync``-mode ``write()``: commit without the sync (on a worker thread only when
        the commit itself may block), then wait for the syncer (:mod:`memfs.fs.syncer`)."""
        if handle.session.may_block_append(len(buf), buf.count(b"\n") + 1, sync=False):
            n = await self._off_loop(self._write, handle, off, buf)
        else:
            n = self._write(handle, off, buf)
        await self.durability.durable(handle.session)
        return n

    def _write(self, handle: OpenFile, off: int, buf: bytes) -> int:
        appender = handle.appender
        if handle.append_mode:
            return appender.write(buf)
        if off != handle.next_off and off != handle.session.file_len + len(appender.partial):
            raise fail("EPERM")  # only appending at the handle's own end or the log's; no overwrite
        n = appender.write(buf)
        handle.next_off = off + n
        return n

    @guarded
    async def flush(self, fh):
        handle = self.files.get(fh)
        if handle is None or handle.appender is None or not handle.appender.partial:
            return
        appender = handle.appender
        try:
            if self.cluster is not None or handle.session.may_block_append(len(appender.partial), sync=appender.sync):
                await self._off_loop(appender.close)
            else:
                appender.close()
        except OSError:
            handle.close_failed = bool(appender.partial)  # reported to the closing process
            raise
        handle.close_failed = False
        if not appender.sync:
            await self.durability.durable(handle.session)

    @guarded
    async def fsync(self, fh, datasync):
        handle = self.files.get(fh)
        if handle is not None and handle.session is not None and not handle.session.read_only:
            await self._off_loop(handle.session.flush)

    def close_files(self) -> None:
        """At unmount: release every file still open (the kernel may not have sent each
        RELEASE), so that closing the store closes, persists and unlocks every session."""
        for handle in list(self.files.values()):
            self._release(handle)
        self.files.clear()

    async def release(self, fh):
        handle = self.files.pop(fh, None)
        if handle is not None and (handle.appender is not None or handle.session is not None):
            # a final fragment's commit, the last handle's persist: may wait for the disk
            await self._off_loop(self._release, handle)
        else:
            self._release(handle)

    def _release(self, handle: OpenFile | None) -> None:
        if handle is not None and handle.fd >= 0:
            os.close(handle.fd)
            handle.fd = -1
        if handle is not None and handle.reader is not None:
            handle.reader.close()
            handle.reader = None
        if handle is not None and handle.appender is not None and handle.appender.partial:
            if handle.close_failed:
                log.warning("release: final line of %s (%d bytes) dropped: its close() failed",
                            handle.session.name, len(handle.appender.partial))
                handle.appender.partial = bytearray()
            else:
                try:
                    handle.appender.close()
                except MemfsError:
                    pass  # recorded in rejected.jsonl; nobody is left to tell
                except OSError as exc:  # release is not guarded: an escaping error ends the mount
                    log.warning("release: final line of %s lost: %s", handle.session.name, exc)
        if handle is not None and handle.session is not None:
            try:
                if handle.writing:
                    handle.writing = False
                    handle.session.end_writing()
                handle.session.close()
                self.store.trim()  # idle now, maybe: past max_open_sessions it goes (SPEC §3.5)
            except (MemfsError, OSError) as exc:  # (the last handle's close persists)
                log.warning("release: closing %s: %s", handle.session.name, exc)

    # --- attributes and statistics -------------------------------------------------------------

    def _xattrs(self, node: Node) -> dict[bytes, bytes]:
        if node.kind is K.ROOT:  # the mount's own state
            values = {b"user.memfs.writes_gated": str(self.gate.gated).encode(),  # memfs.fs.gate
                      b"user.memfs.background_waits": str(self.pacer.waits).encode(),  # memfs.pace
                      b"user.memfs.background_waited_ms": str(self.pacer.waited_ns // 1_000_000).encode(),
                      b"user.memfs.attr_ticked": str(self.attr_ticked).encode(),  # _attr_timeout
                      b"user.memfs.attr_unticked": str(self.attr_unticked).encode(),
                      b"user.memfs.attr_tick_sessions": str(len(self._ticked)).encode()}
            if self.reader is not None:  # memfs.fs.reader: requests read at once / after a wait
                values[b"user.memfs.requests_read_at_once"] = str(self.reader.read_at_once).encode()
                values[b"user.memfs.requests_read_after_wait"] = str(self.reader.read_after_wait).encode()
            if self.warm_pending is not None:
                values[b"user.memfs.warm_pending"] = str(self.warm_pending).encode()
            helper = rescanner.current()  # the mount's: large logs' rescans in its process
            if helper is not None:
                values[b"user.memfs.helper_rescans"] = str(helper.rescans).encode()
            if self.cluster is not None:
                values.update(self._cluster_xattrs())
            return values
        if node.kind is K.EVENTS:  # where a refused write went: its reason there too
            reason = self._session(node).last_refusal
            return {} if reason is None else {b"user.memfs.last_error": reason.encode()}
        if node.kind is not K.SESSION:
            return {}
        return self._session_xattrs(node)

    def _cluster_xattrs(self) -> dict[bytes, bytes]:
        """The mount's cluster state (memfs mounts)."""
        return {b"user.memfs.cluster": self.cluster.describe().encode(),
                b"user.memfs.cluster_lag": f"{self.cluster.lag():.3f}".encode(),
                # the follower: the checkpoint it resumed after, and what it delivered since
                b"user.memfs.cluster_resumed_after": str(self.cluster.resumed_after).encode(),
                b"user.memfs.cluster_delivered": str(self.cluster.delivered_count).encode(),
                # delivered messages waiting for the applier (bounded by [cluster] backlog)
                b"user.memfs.cluster_backlog": str(self.cluster.backlog()).encode(),
                # the event loop's own connection: the server it speaks to (- : none now),
                # and how many appends it published
                b"user.memfs.cluster_direct": ((self.nats and self.nats.connected_url) or "-").encode(),
                b"user.memfs.cluster_direct_appends": str(self.cluster.fast_appends).encode()}

    def _session_xattrs(self, node: Node) -> dict[bytes, bytes]:
        session = self._session(node)
        m = session.manifest
        values = {
            b"user.memfs.status": m["status"],
            b"user.memfs.turn_count": str(m["turn_count"]),
            b"user.memfs.event_count": str(m["event_count"]),
            b"user.memfs.updated_at": m["updated_at"],
        }
        if session.last_refusal is not None:
            values[b"user.memfs.last_error"] = session.last_refusal
        if self.cluster is not None:  # SPEC §9: how stale this host's replica is, and where it is
            values[b"user.memfs.cluster_lag"] = f"{self.cluster.lag():.3f}"
            values[b"user.memfs.cluster_seq"] = str(self.cluster.seq_of(node.session))
        return {k: v.encode() for k, v in values.items()}

    @guarded
    async def getxattr(self, inode, name, ctx):
        node = self._node(inode)
        value = (await self._served(node, self._xattrs, node)).get(name)
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value

    @guarded
    async def listxattr(self, inode, ctx):
        node = self._node(inode)
        return list(await self._served(node, self._xattrs, node))

    @guarded
    async def statfs(self, ctx):
        st = pyfuse3.StatvfsData()
        try:
            vfs = os.statvfs(self.store.root)
        except OSError:
            vfs = None
        st.f_bsize = st.f_frsize = 4096
        if vfs is not None:
            st.f_blocks = vfs.f_blocks * vfs.f_frsize // 4096
            st.f_bfree = vfs.f_bfree * vfs.f_frsize // 4096
            st.f_bavail = vfs.f_bavail * vfs.f_frsize // 4096
        st.f_files = len(self.inodes)
        st.f_namemax = 255
        return st


@functools.lru_cache(maxsize=4096)
def _rfc3339_ns(text: str, default: int) -> int:
    seconds = parse_rfc3339(text)
    return default if seconds is None else int(seconds * 1_000_000_000)
