"""Reading the side files an agent's record names, safely (SPEC §10 "untrusted input").

A transcript names other files (Claude Code's ``<session>/tool-results/<id>.txt``); those names
are untrusted. :class:`SideReader` is what a runner hands a translator: it opens a relative
path only inside one directory, one component at a time with ``O_NOFOLLOW`` (no symlink, no
``..``, no hidden or empty component), only a regular file, and returns its text bounded as an
item's output is (:func:`memfs.ingest.bounded_output`: at most the first and last 2 KiB are
read, whatever the file's size). Anything else reads as None.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from memfs.ingest import OUTPUT_HEAD, OUTPUT_TAIL, bounded_output

_COMPONENT = re.compile(r"\A[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}\Z")
MAX_DEPTH = 4


class SideReader:
    """``reader(relpath) -> str | None``: a file under ``root``, bounded (see the module)."""

    def __init__(self, root: str | os.PathLike):
        self.root = os.fspath(root)

    @classmethod
    def for_transcript(cls, path: str | os.PathLike) -> SideReader:
        """The reader for a Claude Code transcript: rooted at the project directory that holds
        ``<session>.jsonl`` and ``<session>/`` (for a sub-agent's ``<session>/subagents/
        agent-<id>.jsonl``, three levels up)."""
        p = Path(path).absolute()
        return cls(p.parent.parent.parent if p.parent.name == "subagents" else p.parent)

    def __call__(self, relpath: str) -> str | None:
        parts = relpath.split("/")
        if not 0 < len(parts) <= MAX_DEPTH or not all(_COMPONENT.match(c) for c in parts):
            return None
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.root, flags | os.O_DIRECTORY)
        except OSError:
            return None
        try:
            for part in parts[:-1]:
                nxt = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = nxt
            nxt = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
            os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            if st.st_size <= OUTPUT_HEAD + OUTPUT_TAIL:
                data = os.pread(fd, OUTPUT_HEAD + OUTPUT_TAIL + 1, 0)
                return bounded_output(data.decode("utf-8", "replace"))
            head = os.pread(fd, OUTPUT_HEAD, 0).decode("utf-8", "ignore")
            tail = os.pread(fd, OUTPUT_TAIL, st.st_size - OUTPUT_TAIL).decode("utf-8", "ignore")
            return head + "\n…\n" + tail  # what bounded_output() gives for the whole file
        except OSError:
            return None
        finally:
            os.close(fd)
