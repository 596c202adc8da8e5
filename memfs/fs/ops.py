"""The pyfuse3 operations: each handler maps one request onto the library (SPEC §6).

Translation only, each handler thin: the append semantics live in :mod:`memfs.store.appender`, sessions in
:mod:`memfs.store.root`, views in :mod:`memfs.views`, search in :mod:`memfs.search`; errno
numbers in :mod:`memfs.fs.errors`. Every handler runs under :func:`guarded`.

Decisions recorded here:

* ``events.jsonl`` is opened with ``direct_io``: short writes reach the writer, and reads
  always see the log as it is. Generated files are snapshots taken at ``open``, also
  ``direct_io``, so tools read them whole.
* Writing ``events.jsonl`` (one route for every mode, a pending fragment at ``flush``):
  :mod:`memfs.fs.writes`. The tree, sizes and generated files: :mod:`memfs.fs.tree`;
  extended attributes: :mod:`memfs.fs.xattrs`; attribute ticks: :mod:`memfs.fs.ticks`.
* ``touch`` (time-only ``setattr``) is accepted and ignored; size, mode and owner changes
  are ``EPERM``.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyfuse3
import trio
from memfs import views
from memfs.errors import MemfsError
from memfs.fs.attrs import Attributes
from memfs.fs.errors import fail, guarded, log
from memfs.fs.gate import WriteGate
from memfs.fs.nodes import BACKING_FILES, DIR_KINDS, InodeTable, K, Node, child
from memfs.fs.ticks import AttrTicks
from memfs.fs.tree import Tree
from memfs.fs.writes import WritePath
from memfs.fs.xattrs import Xattrs
from memfs.pace import Pacer, as_worker
from memfs.store.appender import LineAppender
from memfs.store.paths import open_nofollow
from memfs.store.reading import LogReader
from memfs.store.root import Store
from memfs.store.session import SessionHandle

if TYPE_CHECKING:  # (memfs without --cluster never loads the cluster modules)
    from memfs.cluster.node import ClusterNode
    from memfs.cluster.wire import Connection
    from memfs.fs.syncer import Durability

# Generated in a worker thread when the views must refresh first (a first render of a large
# session can take a while, and the trio loop must keep serving); a current view, and every
# other generated file, is cheaper to serve inline than the thread hop.
SLOW_KINDS = frozenset({K.VIEW, K.TURN})

# searcher(query, session or None for all, k or None, min_score or None, options=None) -> results
Searcher = Callable[..., list]  # memfs.search.store_searcher


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
    writing: bool = False  # the session handle claims to be writing (SessionWrites.claim_writing)
    close_failed: bool = False  # a flush could not commit the fragment: release drops it


def _refused(ops: Operations) -> pyfuse3.FUSEError:
    """The reply to a change the mount does not make."""
    return fail("EROFS" if ops.opts.read_only else "EPERM")


def _refusing(name: str) -> Callable:
    """The handler ``name`` of a change the mount never makes (``unlink``, ``rename``, …)."""

    async def handler(self: Operations, *args: Any) -> None:
        raise _refused(self)

    handler.__name__ = handler.__qualname__ = name
    return guarded(handler)


class Operations(pyfuse3.Operations):
    """memfs as a pyfuse3 filesystem over a :class:`Store`: thin handlers over the mount's
    :class:`~memfs.fs.tree.Tree`, :class:`~memfs.fs.writes.WritePath`,
    :class:`~memfs.fs.xattrs.Xattrs` and :class:`~memfs.fs.ticks.AttrTicks`."""

    supports_dot_lookup = False
    enable_writeback_cache = False

    def __init__(self, store: Store, options: MountOptions, searcher: Searcher | None = None):
        super().__init__()
        self.store = store
        self.opts = options
        self.searcher = searcher
        # a session written, created or removed here: its search index entry is refreshed at the
        # next root query (memfs.search.changes)
        self.search_notice: Callable[[str], None] = getattr(searcher, "notice", None) or (lambda name: None)
        root = Node(K.SESSION, options.single_session) if options.single_session else Node(K.ROOT)
        self.inodes = InodeTable(root)
        self.files: dict[int, OpenFile] = {}
        self.dirs: dict[int, list[tuple[str, Node]]] = {}
        self._fhs = itertools.count(1)  # file (and directory) handle numbers
        self.started = time.time_ns()
        self.cluster: ClusterNode | None = None  # in cluster mode (SPEC §9), set before mounting
        self.nats: Connection | None = None  # with it: the event loop's own NATS connection
        self.durability: Durability | None = None  # while mounted: fsync mode's waits
        self.gate = WriteGate()  # appends give way to queued requests (its queue poll is set at mount)
        self.pacer = Pacer()  # background work gives way to the loop (it watches the loop at mount)
        self.warm_pending: int | None = None  # sessions the search index's warm-up has still to index (once listed)
        self.tree = Tree(self)
        self.ticks = AttrTicks(store)
        self.writes = WritePath(self)
        self.xattrs = Xattrs(self)
        self.attrs = Attributes(self)

    # --- helpers -----------------------------------------------------------------------------

    def _node(self, inode: int) -> Node:
        node = self.inodes.node(inode)
        if node is None:
            raise fail("ENOENT")
        return node

    def _inline(self, node: Node) -> bool:
        """Whether a request about ``node`` can be served on the event loop: it belongs to no
        session, or its session is held open and no other thread holds it busy (a cap rewrite,
        an append waiting for its lock), or it is a session's folder that the store catalog has
        a row of (its attributes are the row's: ``ls -l sessions/`` opens no session). Otherwise the request runs on a worker thread, where
        opening the session (a rescan, maybe) or waiting for it blocks nobody else (SPEC §6)."""
        name = node.session
        if name is None:
            return True
        handle = self.store.held(name)
        if handle is None:  # a session's own folder not open here: the store catalog's row answers
            return node.kind is K.SESSION and self.store.catalog().listing().updated(name) is not None
        return handle.reads.free()

    async def _served(self, node: Node, fn: Callable, *args: Any) -> Any:
        """``fn(*args)``, inline when :meth:`_inline` says so, else on a worker thread."""
        self.gate.note_other()
        if self._inline(node):
            return fn(*args)
        return await self.off_loop(fn, *args)

    async def off_loop(self, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` on a worker thread, the calling task waiting (not cancellable: a
        started append or persist always completes and its result is the reply). A lighter hop
        than ``trio.to_thread.run_sync`` — no capacity limiter, no thread renaming, no context
        copy — for the requests that must wait for the disk. The number of threads is bounded
        by pyfuse3's ``max_tasks``. While a request is served this way, background work does
        not give way to the loop (:mod:`memfs.pace`: the request may be waiting for it)."""
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()

        def deliver(result) -> None:
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        with self.pacer.hop():
            trio.lowlevel.start_thread_soon(functools.partial(as_worker, fn, *args), deliver)
            return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

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

    def _slow(self, node: Node) -> bool:
        """Whether the size or content of ``node`` is computed on a worker thread."""
        if node.kind is K.USAGE_FILE:
            return not self.tree.usage.current(node.arg)
        return not self._inline(node) or (node.kind in SLOW_KINDS and not views.is_current(self.tree.session(node)))

    async def _attr(self, node: Node, inode: int | None = None) -> pyfuse3.EntryAttributes:
        kind = node.kind
        if kind is K.QUERY:
            size, mtime = len(await self.tree.query_bytes(node)), time.time_ns()
        elif self._slow(node):
            size, mtime = await self.off_loop(self.tree.size, node)
        else:
            size, mtime = self.tree.size(node)
        return self.attrs.of(node, size, mtime, inode)

    # --- names -------------------------------------------------------------------------------

    @guarded
    async def lookup(self, parent_inode, name, ctx=None):
        parent = self._node(parent_inode)
        node = child(parent, os.fsdecode(name), self.opts.single_session is not None)
        if node is None or not await self._served(node, self.tree.exists, node):
            raise fail("ENOENT")
        if node.kind is K.EVENTS:
            node = await self._served(node, self.tree.versioned, node)
        attr = await self._attr(node)
        self.inodes.remember(attr.st_ino)
        return attr

    @guarded
    async def getattr(self, inode, ctx=None):
        node = self._node(inode)
        if not await self._served(node, self.tree.exists, node):
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
            raise _refused(self)
        return await self._attr(node, inode)

    # --- directories -------------------------------------------------------------------------

    @guarded
    async def opendir(self, inode, ctx):
        node = self._node(inode)
        if node.kind not in DIR_KINDS:
            raise fail("ENOTDIR")
        fh = next(self._fhs)
        self.dirs[fh] = await self.off_loop(self.tree.listing, node)
        return fh

    @guarded
    async def readdir(self, fh, start_id, token):
        entries = self.dirs[fh]
        times = self.store.catalog().listing().times() if self.opts.single_session is None else None
        for i in range(start_id, len(entries)):
            name, node = entries[i]
            try:
                attr = self.attrs.listed(node, times) or await self._attr(node)
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
        await self.off_loop(self.store.create, session)
        self.search_notice(session)
        attr = await self._attr(Node(K.SESSION, session))
        self.inodes.remember(attr.st_ino)
        return attr

    @guarded
    async def rmdir(self, parent_inode, name, ctx):
        session = self._session_entry(parent_inode, name)
        await self.off_loop(self.store.remove, session)
        self.tree.usage.touch(session)
        self.search_notice(session)
        self.ticks.untick(session)
        self.inodes.drop_session(session)
        views.forget(self.store.root / session)
        self.tree.forget_session(session)

    # --- refused changes: EPERM (EROFS on a read-only mount) -----------------------------------

    unlink = _refusing("unlink")
    rename = _refusing("rename")
    link = _refusing("link")
    symlink = _refusing("symlink")
    mknod = _refusing("mknod")
    create = _refusing("create")
    setxattr = _refusing("setxattr")
    removexattr = _refusing("removexattr")

    # --- files -------------------------------------------------------------------------------

    @guarded
    async def open(self, inode, flags, ctx):
        node = self._node(inode)
        if node.kind in DIR_KINDS:
            raise fail("EISDIR")
        if not await self._served(node, self.tree.exists, node):
            raise fail("ENOENT")
        writing = flags & os.O_ACCMODE != os.O_RDONLY
        if flags & os.O_TRUNC or (writing and node.kind is not K.EVENTS):
            raise _refused(self)
        handle = OpenFile(node)
        if node.kind is K.EVENTS:
            await self._served(node, self._open_events, handle, writing, flags, ctx.pid)
        elif node.kind in BACKING_FILES:  # streamed from an fd: never copied whole into memory
            try:
                handle.fd = open_nofollow(self.tree.backing(node), os.O_RDONLY)
            except FileNotFoundError:
                handle.snapshot = b""
        elif node.kind is K.QUERY:
            handle.snapshot = await self.tree.query_bytes(node)
        else:
            tree = self.tree
            handle.snapshot = await self.off_loop(tree.content, node) if self._slow(node) else tree.content(node)
            if node.kind is not K.README:
                tree.content_mtime(node, handle.snapshot)
        fh = next(self._fhs)
        self.files[fh] = handle
        return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=False)

    def _open_events(self, handle: OpenFile, writing: bool, flags: int, pid: int) -> None:
        """Open ``events.jsonl`` (inline or on a worker thread, see :meth:`_served`)."""
        node = handle.node
        if writing and (self.opts.read_only or self.tree.session(node).read_only):
            raise fail("EROFS")
        session = handle.session = self.store.share(node.session)  # its own: the store may close its handle
        try:
            handle.reader = session.reader()  # keeps its version across cap rewrites (SPEC §3.7)
            if writing:
                self.writes.open(handle, session, flags, pid)
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
            return await self.off_loop(reader.read, off, size)
        return reader.read(off, size)

    @guarded
    def write(self, fh, off, buf):  # plain, not async: see guarded()
        handle = self.files[fh]
        self.tree.usage.touch(handle.node.session)  # usage/ re-reads this session at its next read
        self.search_notice(handle.node.session)  # and the root search
        return self.writes.write(handle, off, buf)

    @guarded
    async def flush(self, fh):
        handle = self.files.get(fh)
        if handle is not None:
            await self.writes.flush(handle)

    @guarded
    async def fsync(self, fh, datasync):
        handle = self.files.get(fh)
        if handle is not None and handle.session is not None and not handle.session.read_only:
            await self.off_loop(handle.session.flush)

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
            await self.off_loop(self._release, handle)
        else:
            self._release(handle)

    def _release(self, handle: OpenFile | None) -> None:
        if handle is None:
            return
        if handle.fd >= 0:
            os.close(handle.fd)
            handle.fd = -1
        if handle.reader is not None:
            handle.reader.close()
            handle.reader = None
        self.writes.finish_fragment(handle)
        if handle.session is not None:
            try:
                if handle.writing:
                    handle.writing = False
                    handle.session.writes.end_writing()
                handle.session.close()
                self.store.trim()  # idle now, maybe: past max_open_sessions it goes (SPEC §3.5)
            except (MemfsError, OSError) as exc:  # (the last handle's close persists)
                log.warning("release: closing %s: %s", handle.session.name, exc)

    # --- attributes and statistics -------------------------------------------------------------

    @guarded
    async def getxattr(self, inode, name, ctx):
        if not name.startswith(b"user."):  # no ACLs, no security labels: ls -l then stops asking this device
            raise pyfuse3.FUSEError(errno.EOPNOTSUPP)
        if not name.startswith(b"user.memfs."):
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        node = self._node(inode)
        value = (await self._served(node, self.xattrs.of, node)).get(name)
        if value is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        return value

    @guarded
    async def listxattr(self, inode, ctx):
        node = self._node(inode)
        return list(await self._served(node, self.xattrs.of, node))

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
