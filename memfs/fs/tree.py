"""The mount's tree as the store has it now: which nodes exist, what a directory lists, a
node's size and time, and the snapshot bytes of a generated file (SPEC §6).

Reading only; no request plumbing (:mod:`memfs.fs.ops` decides where each call runs).
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

import trio
from memfs.errors import MemfsError, NotFound
from memfs.fs import content
from memfs.fs.errors import fail
from memfs.fs.nodes import BACKING_FILES, DYNAMIC_KINDS, INDEX_CHILDREN, SESSION_CHILDREN, K, Node, child
from memfs.pace import as_worker
from memfs.store.meta import parse_rfc3339
from memfs.store.paths import refuse_symlink
from memfs.store.session import SessionHandle
from memfs.store.sessioninfo import updated_at_of
from memfs.usage.aggregate import NAMES as USAGE_NAMES
from memfs.usage.aggregate import Aggregator

if TYPE_CHECKING:
    from pathlib import Path

    from memfs.fs.ops import Operations

SEARCH_TIMEOUT = 10.0  # seconds a search may take before the open fails with ETIMEDOUT


class Tree:
    """The nodes of one mount (its :class:`~memfs.fs.ops.Operations`' store and options)."""

    def __init__(self, ops: Operations):
        self.ops = ops
        self.store = ops.store
        self.single = ops.opts.single_session
        self._mtimes: dict[Node, tuple[tuple[int, int], int]] = {}  # generated file → (content key, mtime)
        self.usage = Aggregator(self.store)  # usage/ (SPEC §12), on a whole store's mount

    def session(self, node: Node) -> SessionHandle:
        return self.store.held(node.session) or self.store.open(node.session)

    def exists(self, node: Node) -> bool:
        """Whether a node found by shape exists now."""
        kind = node.kind
        if node.session is not None and not self.store.exists(node.session):
            return False
        if kind is K.VIEW:  # the fixed views exist without listing derived/ at every stat
            return content.is_view_name(node.arg) or node.arg in content.view_names(self.session(node))
        if kind is K.TURN:
            return int(node.arg) in content.turn_numbers(self.session(node))
        if kind is K.QUERY:
            return content.parse_query(node.arg) is not None
        if kind is K.USAGE_FILE:
            return node.arg in USAGE_NAMES
        if kind is K.IMPORT_SOURCES:
            return refuse_symlink(self.backing(node)) is not None
        return True

    def versioned(self, node: Node) -> Node:
        """``events.jsonl`` is a new file in the mount whenever the log is replaced (SPEC §3.7: a
        cap rewrite): its node, hence its inode number, names the log's generation, so
        ``tail -F`` sees the name point to a new file and reopens it."""
        if node.kind is not K.EVENTS:
            return node
        serial, rewrites = self.session(node).reads.generation
        return Node(K.EVENTS, node.session, f"{serial}.{rewrites}")

    def backing(self, node: Node) -> Path:
        """The store's file a :data:`BACKING_FILES` node serves."""
        return self.store.root / node.session / BACKING_FILES[node.kind]

    def listing(self, node: Node) -> list[tuple[str, Node]]:
        """A directory's entries now."""
        kind = node.kind
        if kind is K.ROOT:
            names = ["README.md", "sessions", "search", "usage"]
        elif kind is K.SESSIONS:
            names = self.store.names()
        elif kind is K.SESSION:
            names = (["README.md"] if self.single else []) + list(SESSION_CHILDREN)
        elif kind is K.INDEX:
            names = [name for name, sub in INDEX_CHILDREN.items() if self.exists(Node(sub, node.session))]
        elif kind is K.DERIVED:
            names = content.view_names(self.session(node)) + ["turns"]
        elif kind is K.TURNS:
            names = [f"{n}.jsonl" for n in content.turn_numbers(self.session(node))]
        elif kind is K.USAGE:
            names = list(USAGE_NAMES)
        else:  # search/: queries are not listed
            names = []
        single = self.single is not None
        return [(name, self.versioned(child(node, name, single))) for name in names]

    def content(self, node: Node) -> bytes:
        """The bytes of a generated file as they are now."""
        kind = node.kind
        if kind is K.README:
            return content.SINGLE_README if self.single else content.README
        if kind is K.USAGE_FILE:
            return self.usage.content(node.arg)
        session = self.session(node)
        if kind is K.MANIFEST:
            return session.reads.manifest_json()
        if kind is K.TURNS_JSON:
            return session.reads.turn_index_json()
        if kind is K.VIEW:
            return content.view_bytes(session, node.arg)
        if kind is K.TURN:
            return content.view_bytes(session, f"turns/{node.arg}.jsonl")
        raise NotFound(f"not a generated file: {kind}")

    async def query_bytes(self, node: Node) -> bytes:
        """A search's results (on a worker thread, at most :data:`SEARCH_TIMEOUT` seconds)."""
        query = content.parse_query(node.arg)
        searcher = self.ops.searcher
        if query is None or searcher is None:
            raise fail("ENOENT")
        with trio.move_on_after(SEARCH_TIMEOUT) as scope:
            with self.ops.pacer.hop():  # (as in Operations.off_loop; abandoned at the timeout)
                search = functools.partial(searcher, options=dict(query.params))  # SPEC §5.1 options
                results = await trio.to_thread.run_sync(as_worker, search, query.text, node.session, query.k,
                                                        query.min_score, abandon_on_cancel=True)
        if scope.cancelled_caught:
            raise fail("ETIMEDOUT")
        return content.render_results(results, query.format)

    def size(self, node: Node) -> tuple[int, int]:
        """``(size, mtime_ns)`` of a node now (SPEC §6: times are real)."""
        kind = node.kind
        started = self.ops.started
        if kind is K.EVENTS:
            session = self.session(node)
            if node.arg is not None and node.arg != "%d.%d" % session.reads.generation:
                for handle in list(self.ops.files.values()):  # an old version, kept by its readers
                    if handle.node == node and handle.reader is not None and handle.reader.fd is not None:
                        st = os.fstat(handle.reader.fd)
                        return st.st_size, st.st_mtime_ns
            return session.file_len, self._file_mtime(session.path / "events.jsonl")
        if kind in BACKING_FILES:
            st = refuse_symlink(self.backing(node))  # ELOOP, as its open: not the size of a link planted there
            return (st.st_size, st.st_mtime_ns) if st is not None else (0, started)
        if kind is K.SESSION:
            held = self.store.held(node.session)
            if held is None:  # not open here: the store catalog's row (readdir never opens each session)
                known = self.store.catalog().listing().updated(node.session)
                if known is None:  # not catalogued yet (the catalog being built): its folder, read, not opened
                    return 0, _rfc3339_ns(updated_at_of(self.store.root / node.session), started)
                return 0, known if known >= 0 else started
            try:  # a session that cannot be opened (a planted link) is still listed, as before
                updated = (held or self.session(node)).manifest["updated_at"]
            except (MemfsError, OSError):
                return 0, started
            return 0, _rfc3339_ns(updated, started)
        if kind in DYNAMIC_KINDS and kind is not K.QUERY and kind is not K.README:
            data = self.content(node)
            return len(data), self.content_mtime(node, data)
        if kind is K.README:
            return len(self.content(node)), started
        return 0, started

    def _file_mtime(self, path: Path) -> int:
        try:
            return os.stat(path, follow_symlinks=False).st_mtime_ns
        except OSError:
            return self.ops.started

    def content_mtime(self, node: Node, data: bytes) -> int:
        """When a generated file's content last changed: the log's mtime when this server
        first saw it, or when it saw it change (so ``ls -lt`` sorts by recency and a second
        ``rsync -a`` finds nothing new)."""
        if node.kind is K.USAGE_FILE:
            return self.usage.mtime_ns
        key = (len(data), hash(data))
        seen = self._mtimes.get(node)
        if seen is not None and seen[0] == key:
            return seen[1]
        mtime = self._file_mtime(self.store.root / node.session / "events.jsonl")
        if seen is not None:
            mtime = max(mtime, seen[1] + 1)
        self._mtimes[node] = (key, mtime)
        return mtime

    def forget_session(self, session: str) -> None:
        """A removed session's generated files' times."""
        for node in [n for n in self._mtimes if n.session == session]:
            del self._mtimes[node]


@functools.lru_cache(maxsize=4096)
def _rfc3339_ns(text: str, default: int) -> int:
    seconds = parse_rfc3339(text)
    return default if seconds is None else int(seconds * 1_000_000_000)
