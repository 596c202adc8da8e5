"""The served tree and its inode table (SPEC §6).

A :class:`Node` names a place in the tree by what it is (``kind``), which session it belongs
to and one argument (a view name, a turn number, a query). The tree's shape is a pure
function of nodes (:func:`child`); what *exists* right now (sessions, turns, stored views)
is asked of the library by the operations layer.

:class:`InodeTable` follows the kernel's lookup counts: an inode is kept while the kernel
holds references to it and dropped on ``forget`` — so a long-running mount does not grow
with every search name ever looked up.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import pyfuse3
from memfs.store import paths


class K(enum.Enum):
    """Node kinds."""

    ROOT = "root"  # mountpoint of a whole store
    README = "readme"
    SESSIONS = "sessions"  # sessions/
    SESSION = "session"  # sessions/<s>/ (or the root of a --session mount)
    EVENTS = "events"
    MANIFEST = "manifest"
    REJECTED = "rejected"
    INDEX = "index"  # <s>/index/
    TURNS_JSON = "turns_json"  # <s>/index/turns.json
    IMPORT_SOURCES = "import_sources"  # <s>/index/import-sources.json, when memfs import made one
    DERIVED = "derived"  # <s>/derived/
    VIEW = "view"  # <s>/derived/<name>
    TURNS = "turns"  # <s>/derived/turns/
    TURN = "turn"  # <s>/derived/turns/<n>.jsonl
    SEARCH = "search"  # search/ or <s>/search/
    QUERY = "query"  # search/<query>
    USAGE = "usage"  # usage/ (a whole store's mount only)
    USAGE_FILE = "usage_file"  # usage/<name>: daily.json, by-model.md, ...


DIR_KINDS = frozenset({K.ROOT, K.SESSIONS, K.SESSION, K.INDEX, K.DERIVED, K.TURNS, K.SEARCH, K.USAGE})
# Files generated at open into a per-handle snapshot.
DYNAMIC_KINDS = frozenset({K.README, K.MANIFEST, K.TURNS_JSON, K.VIEW, K.TURN, K.QUERY, K.USAGE_FILE})


@dataclass(frozen=True, slots=True)
class Node:
    kind: K
    session: str | None = None  # None: the whole store (root search) or no session
    arg: str | None = None


# Files of the session folder served read-only as they are on disk, by the path under it:
# listed only when present (but rejected.jsonl, always listed, empty when absent).
BACKING_FILES = {K.REJECTED: paths.REJECTED, K.IMPORT_SOURCES: paths.IMPORT_SOURCES}

# Children of index/, by file name: turns.json always, the others when present.
INDEX_CHILDREN = {"turns.json": K.TURNS_JSON, paths.IMPORT_SOURCES.rpartition("/")[2]: K.IMPORT_SOURCES}

# Fixed children of a session directory, by file name.
SESSION_CHILDREN = {
    "events.jsonl": K.EVENTS,
    "manifest.json": K.MANIFEST,
    "rejected.jsonl": K.REJECTED,
    "index": K.INDEX,
    "derived": K.DERIVED,
    "search": K.SEARCH,
}


def child(parent: Node, name: str, single_session: bool) -> Node | None:
    """The node ``name`` would be under ``parent`` by shape alone (no existence check for
    sessions, views or turns: the caller asks the library)."""
    kind, s = parent.kind, parent.session
    if kind is K.ROOT:
        return {"README.md": Node(K.README), "sessions": Node(K.SESSIONS), "search": Node(K.SEARCH),
                "usage": Node(K.USAGE)}.get(name)
    if kind is K.SESSIONS:
        return Node(K.SESSION, name)
    if kind is K.SESSION:
        if single_session and name == "README.md":
            return Node(K.README)
        sub = SESSION_CHILDREN.get(name)
        return Node(sub, s) if sub else None
    if kind is K.INDEX:
        sub = INDEX_CHILDREN.get(name)
        return Node(sub, s) if sub else None
    if kind is K.DERIVED:
        return Node(K.TURNS, s) if name == "turns" else Node(K.VIEW, s, name)
    if kind is K.TURNS:
        if name.endswith(".jsonl") and name[:-6].isdigit():
            return Node(K.TURN, s, str(int(name[:-6])))
        return None
    if kind is K.SEARCH:
        return Node(K.QUERY, s, name)
    if kind is K.USAGE:
        return Node(K.USAGE_FILE, None, name)
    return None


class InodeTable:
    """Inode numbers for nodes, with the kernel's lookup counts."""

    def __init__(self, root: Node):
        self._node = {pyfuse3.ROOT_INODE: root}
        self._ino = {root: pyfuse3.ROOT_INODE}
        self._lookups: dict[int, int] = {}
        self._next = pyfuse3.ROOT_INODE + 1

    def __len__(self) -> int:
        return len(self._node)

    def inode(self, node: Node) -> int:
        """The inode of ``node``, allocating one on first sight."""
        ino = self._ino.get(node)
        if ino is None:
            ino = self._next
            self._next += 1
            self._ino[node] = ino
            self._node[ino] = node
        return ino

    def node(self, ino: int) -> Node | None:
        return self._node.get(ino)

    def remember(self, ino: int) -> None:
        """The kernel got a new reference to ``ino`` (lookup, mkdir, readdirplus entry)."""
        self._lookups[ino] = self._lookups.get(ino, 0) + 1

    def forget(self, ino: int, n: int) -> None:
        """The kernel dropped ``n`` references; an unreferenced inode is forgotten."""
        left = self._lookups.get(ino, 0) - n
        if left > 0:
            self._lookups[ino] = left
            return
        self._lookups.pop(ino, None)
        if ino != pyfuse3.ROOT_INODE:
            node = self._node.pop(ino, None)
            if node is not None:
                self._ino.pop(node, None)

    def drop_session(self, session: str) -> None:
        """Forget which inodes belonged to a removed session (the kernel may still hold them;
        they resolve to nothing and answer ENOENT)."""
        for node in [n for n in self._ino if n.session == session]:
            self._ino.pop(node, None)
