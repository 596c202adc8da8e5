"""The attributes a mount gives its nodes (SPEC §6): sizes and real times, modes, and how long
the kernel may cache each — and the entries of ``sessions/`` answered from the store catalog's
listing, with no session opened."""

from __future__ import annotations

import stat
from typing import TYPE_CHECKING

import pyfuse3
from memfs.fs.nodes import DIR_KINDS, K, Node

if TYPE_CHECKING:
    from memfs.fs.ops import Operations

# Seconds the kernel may cache: names that never change vs. anything that does.
STATIC_TIMEOUT = 60.0
ENTRY_TIMEOUT = 1.0
# A session's metadata files, cached by the kernel for one clock tick while nothing in this
# mount writes the session (memfs.fs.ticks).
TICKED_KINDS = frozenset({K.MANIFEST, K.TURNS_JSON})


class Attributes:
    """Fills :class:`pyfuse3.EntryAttributes` for the mount's :class:`~memfs.fs.ops.Operations`."""

    def __init__(self, ops: Operations):
        self.ops = ops

    def of(self, node: Node, size: int, mtime: int, inode: int | None = None) -> pyfuse3.EntryAttributes:
        """The attributes of ``node`` of ``size`` and ``mtime``, with their timeouts."""
        kind = node.kind
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode if inode is not None else self.ops.inodes.inode(node)  # after the size: no inode for a failure
        attr.st_size = size
        writable = not self.ops.opts.read_only
        if kind in DIR_KINDS:
            attr.st_mode = stat.S_IFDIR | (0o755 if writable and kind in (K.SESSIONS, K.SESSION) else 0o555)
            attr.st_nlink = 2
        else:
            attr.st_mode = stat.S_IFREG | (0o644 if writable and kind is K.EVENTS else 0o444)
            attr.st_nlink = 1
        attr.st_blksize = 4096
        attr.st_blocks = (size + 511) // 512
        attr.st_uid, attr.st_gid = self.ops.opts.uid, self.ops.opts.gid
        attr.st_atime_ns = attr.st_ctime_ns = self.ops.started
        # Real times (SPEC §6): the log's last append, the session's updated_at, a generated
        # file's last change; other directories and README.md: when the mount started.
        attr.st_mtime_ns = mtime
        static = kind in (K.ROOT, K.README, K.SESSIONS, K.INDEX, K.SEARCH) or (
            kind is K.SESSION and self.ops.opts.single_session)
        if static:
            attr.attr_timeout = attr.entry_timeout = STATIC_TIMEOUT
        elif kind in DIR_KINDS:
            attr.attr_timeout = attr.entry_timeout = ENTRY_TIMEOUT
        else:
            ticked = kind in TICKED_KINDS and self.ops.cluster is None  # (a replica changes without a file open here)
            attr.attr_timeout = self.ops.ticks.timeout(node.session, attr.st_ino) if ticked else 0
            attr.entry_timeout = 0 if kind is K.QUERY else ENTRY_TIMEOUT
        return attr

    def listed(self, node: Node, times: dict[str, int] | None) -> pyfuse3.EntryAttributes | None:
        """The entry of a session folder not open here in a listing of ``sessions/``, from the
        store catalog (None: any other node, answered by ``Operations._attr``). A session the catalog
        has no row of yet (being built, or made by another process a moment ago) is listed by
        name and type only: its time (its manifest's) would be a read per entry, so the entry
        carries the mount's start and is valid for no time at all — the kernel asks again
        (``lookup``, answered from the folder) before it shows anyone its attributes.
        ``times``: the catalog's (:meth:`memfs.store.catalog_listing.Listing.times`), taken once
        per request."""
        if times is None or node.kind is not K.SESSION or self.ops.store.holds(node.session):
            return None
        updated = times.get(node.session)
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = self.ops.inodes.inode(node)
        attr.st_mode = stat.S_IFDIR | (0o555 if self.ops.opts.read_only else 0o755)
        attr.st_nlink = 2
        attr.st_blksize = 4096
        attr.st_uid, attr.st_gid = self.ops.opts.uid, self.ops.opts.gid
        attr.st_atime_ns = attr.st_ctime_ns = self.ops.started
        attr.st_mtime_ns = updated if updated is not None and updated >= 0 else self.ops.started
        attr.attr_timeout = attr.entry_timeout = ENTRY_TIMEOUT if updated is not None else 0
        return attr
