#!/usr/bin/env python3
"""nullfs — a do-nothing pyfuse3 filesystem: "the FUSE ceiling" for benchmarks.

The root directory holds one file, `sink`: writes are accepted (and discarded), reads return
nothing, its size is always 0. Every request is answered as cheaply as pyfuse3 allows, so
timing writes to MNT/sink measures the cost of FUSE + pyfuse3 + trio alone.

Usage: python scripts/nullfs.py MOUNTPOINT    (foreground; SIGINT/SIGTERM unmount cleanly)
       NULLFS_DIRECT_IO=1 python scripts/nullfs.py MOUNTPOINT    (sink opened with direct_io)
       NULLFS_FLOOR=FILE python scripts/nullfs.py MOUNTPOINT
           (each write is validated with memfs.events.parse_line and appended to FILE with one
           write(): the least work any `write`-mode append must do, and none of the rest —
           no turn state, no metadata, no line splitting. A calibration point, not a design.)
       NULLFS_FLOOR=FILE NULLFS_FLOOR_SYNC=1 python scripts/nullfs.py MOUNTPOINT
           (the same, plus fdatasync(FILE) before each reply, inline on the event loop: the
           least an `fsync`-mode append through any pyfuse3 server must do — one FUSE round
           trip around write()+fdatasync(). It blocks its loop: a calibration point for one
           writer, not a design.)
"""
import errno
import os
import signal
import stat
import sys
import time

import pyfuse3
import trio

# NULLFS_DIRECT_IO=1 opens the sink with direct_io, as memfs opens events.jsonl: the FUSE
# ceiling for that kind of file (writes bypass the page cache, short writes are possible).
DIRECT_IO = os.environ.get("NULLFS_DIRECT_IO") == "1"
SINK_NAME = b"sink"
SINK_INODE = pyfuse3.ROOT_INODE + 1
STAMP_NS = time.time_ns()
FLOOR_FILE = os.environ.get("NULLFS_FLOOR")
FLOOR_SYNC = os.environ.get("NULLFS_FLOOR_SYNC") == "1"


class NullFS(pyfuse3.Operations):
    async def getattr(self, inode, ctx=None):
        if inode == pyfuse3.ROOT_INODE:
            mode, nlink = stat.S_IFDIR | 0o755, 2
        elif inode == SINK_INODE:
            mode, nlink = stat.S_IFREG | 0o666, 1
        else:
            raise pyfuse3.FUSEError(errno.ENOENT)
        attr = pyfuse3.EntryAttributes()
        attr.st_ino = inode
        attr.st_mode = mode
        attr.st_nlink = nlink
        attr.st_uid, attr.st_gid = os.getuid(), os.getgid()
        attr.st_size = 0
        attr.st_atime_ns = attr.st_mtime_ns = attr.st_ctime_ns = STAMP_NS
        attr.attr_timeout = attr.entry_timeout = 300  # nothing here ever changes
        return attr

    async def lookup(self, parent_inode, name, ctx=None):
        if parent_inode != pyfuse3.ROOT_INODE or name != SINK_NAME:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return await self.getattr(SINK_INODE)

    async def setattr(self, inode, attr, fields, fh, ctx):
        return await self.getattr(inode)  # accept and ignore (e.g. O_TRUNC from `> sink`)

    async def opendir(self, inode, ctx):
        if inode != pyfuse3.ROOT_INODE:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh, start_id, token):
        if start_id == 0:
            pyfuse3.readdir_reply(token, SINK_NAME, await self.getattr(SINK_INODE), 1)

    async def open(self, inode, flags, ctx):
        if inode != SINK_INODE:
            raise pyfuse3.FUSEError(errno.EISDIR)
        return pyfuse3.FileInfo(fh=inode, direct_io=DIRECT_IO)

    async def read(self, fh, off, size):
        return b""

    async def write(self, fh, off, buf):
        return len(buf)


class FloorFS(NullFS):
    """nullfs plus the unavoidable work of a write-mode append (see the module doc)."""

    def __init__(self, path: str):
        super().__init__()
        from memfs.events import parse_line  # only here: plain nullfs needs no memfs

        self.parse_line = parse_line
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    async def write(self, fh, off, buf):
        self.parse_line(buf)
        n = os.write(self.fd, buf)
        if FLOOR_SYNC:
            os.fdatasync(self.fd)
        return n

    async def release(self, fh):
        pass

    async def statfs(self, ctx):
        st = pyfuse3.StatvfsData()
        st.f_bsize = st.f_frsize = 4096
        st.f_files, st.f_namemax = 2, 255
        return st


async def serve():
    async with trio.open_nursery() as nursery:

        async def stop_on_signal():
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    pyfuse3.terminate()  # makes pyfuse3.main() return
                    return

        nursery.start_soon(stop_on_signal)
        await pyfuse3.main()  # returns on signal or on external unmount
        nursery.cancel_scope.cancel()


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} MOUNTPOINT")
    options = set(pyfuse3.default_options) | {"fsname=nullfs", "default_permissions", "auto_unmount"}
    pyfuse3.init(FloorFS(FLOOR_FILE) if FLOOR_FILE else NullFS(), sys.argv[1], options)
    try:
        trio.run(serve)
    finally:
        pyfuse3.close(unmount=True)


if __name__ == "__main__":
    main()
