"""Which session holds an agent conversation (SPEC §10 "Identity"), and its project.

**Which session.** A conversation (Claude ``sessionId``, Codex thread id, Gemini
``sessionId``) lives in the session whose ``index/about.json`` names it as
``conversation_id`` (and the same ``agent``) — one made by ``memfs record NAME`` under a name
the user chose included — else in a new session named by the id (:func:`session_name`: a
valid ``mkdir`` name). The lookup goes through a small map at the root,
``<root>/.memfs-conversations.json`` (``{conversation id: {session, agent}}``; hidden, so not a
session), replaced atomically under ``.memfs-conversations.lock``. The map is a cache: an
entry is trusted only when the session it names still says that conversation id, and a
missing, unreadable or stale map is rebuilt by one scan of the sessions' ``about.json``. It is
kept by everything that sets a conversation id through the ingest (``import``, ``import
--follow``, ``record``); the first session registered for a conversation keeps it.

:func:`project_of` says a session's ``project``: the git top-level of its ``cwd`` when that
is a directory here inside a work tree, else the ``cwd`` itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

from memfs.agents import agent_name
from memfs.store import about
from memfs.store.paths import (
    NAME_MAX,
    atomic_write,
    ensure_private_dir,
    new_session_name_problem,
    open_nofollow,
    sanitize,
)
from memfs.store.sessiondirs import is_session_dir, session_names

CONVERSATIONS = ".memfs-conversations.json"
CONVERSATIONS_LOCK = ".memfs-conversations.lock"
GIT_TIMEOUT = 5.0


# --- names and the conversation map --------------------------------------------------------------


def session_name(conversation_id: str) -> str:
    """A new session's directory name for an id read from a file: sanitized, no leading
    ``-``, within ``NAME_MAX`` (cut, with a hash of the id) — a valid ``mkdir`` name."""
    name = sanitize(conversation_id)
    if name.startswith("-"):
        name = "_" + name.lstrip("-")
    if len(name) > NAME_MAX:
        name = name[:NAME_MAX - 17] + "-" + hashlib.sha256(conversation_id.encode()).hexdigest()[:16]
    problem = new_session_name_problem(name)
    if problem:  # (cannot happen after the fixes above; a clear error if it ever does)
        raise ValueError(problem)
    return name


def new_session_name(root: Path, conversation_id: str) -> str:
    """:func:`session_name`, unless a session of that name holds another conversation (then
    the name gets a hash of the id)."""
    name = session_name(conversation_id)
    other = about.read(Path(root) / name).get("conversation_id") if is_session_dir(Path(root) / name) else None
    if other and other != conversation_id:
        name = session_name(f"{name[:NAME_MAX - 17]}-{hashlib.sha256(conversation_id.encode()).hexdigest()[:16]}")
    return name


def _agents_match(a: str | None, b: str | None) -> bool:
    return not a or not b or agent_name(a) == agent_name(b)


def _holds(root: Path, name: str, conversation_id: str, agent: str | None) -> bool:
    """The session ``name`` says it holds this conversation."""
    path = root / name
    if not is_session_dir(path):
        return False
    meta = about.read(path)
    if meta.get("conversation_id") == conversation_id and _agents_match(agent, meta.get("agent")):
        return True
    continued = meta.get("continued_in")  # (conversations of other agents it was resumed as)
    return isinstance(continued, dict) and conversation_id in continued and _agents_match(agent, continued[conversation_id])


def _read_map(root: Path) -> dict | None:
    try:
        data = orjson.loads((root / CONVERSATIONS).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError):
        return None
    conv = data.get("conversations") if isinstance(data, dict) else None
    return conv if isinstance(conv, dict) else None


class _MapLock:
    def __init__(self, root: Path):
        self.root = root

    def __enter__(self):
        ensure_private_dir(self.root)
        self.fd = open_nofollow(self.root / CONVERSATIONS_LOCK, os.O_RDWR | os.O_CREAT)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # (releases the lock)


def _scan(root: Path) -> dict:
    """``{conversation id: {session, agent}}`` from every session's ``about.json`` (the first
    session by name wins a conversation two sessions claim)."""
    found: dict = {}
    for name in session_names(root):
        meta = about.read(root / name)
        cid = meta.get("conversation_id")
        if isinstance(cid, str) and cid and cid not in found:
            found[cid] = {"session": name, "agent": meta.get("agent")}
        continued = meta.get("continued_in")
        for other, agent in (continued.items() if isinstance(continued, dict) else ()):
            if isinstance(other, str) and other:
                found.setdefault(other, {"session": name, "agent": agent})
    return found


def rebuild_map(root: Path) -> dict:
    """Scan the sessions and replace the map; returns it."""
    with _MapLock(root):
        conv = _scan(root)
        atomic_write(root / CONVERSATIONS, orjson.dumps({"version": 1, "conversations": conv}))
    return conv


def find_conversation(root: Path, conversation_id: str, agent: str | None = None, *, write: bool = True) -> str | None:
    """The session holding ``conversation_id`` (of ``agent`` when given), or None; ``write``
    False (a dry run): a map in need of a rebuild is not replaced."""
    root = Path(root)
    if not root.is_dir():
        return None
    batch = _batches.get(root)
    conv = batch.current() if batch is not None else _read_map(root)
    if conv is not None:
        entry = conv.get(conversation_id)
        if entry is None:
            return None  # (a map is kept by every capture that names a conversation)
        name = entry.get("session") if isinstance(entry, dict) else None
        if isinstance(name, str) and _holds(root, name, conversation_id, agent):
            return name
    found = rebuild_map(root) if write else _scan(root)  # missing, unreadable or stale
    if batch is not None and write:
        batch.rebuilt(found)
    entry = found.get(conversation_id)
    if entry and _agents_match(agent, entry.get("agent")):
        return entry["session"]
    return None


def _kept(root: Path, conv: dict, conversation_id: str, agent: str | None, session: str) -> bool:
    """The map already gives ``conversation_id`` to ``session``, or to another session that
    still holds it (the first session registered for a conversation keeps it)."""
    entry = conv.get(conversation_id)
    if not isinstance(entry, dict) or not isinstance(entry.get("session"), str):
        return False
    return entry["session"] == session or _holds(root, entry["session"], conversation_id, agent)


def register(root: Path, conversation_id: str, agent: str | None, session: str) -> None:
    """Note that ``session`` holds ``conversation_id`` (unless another session still does);
    within :func:`batched`, held until the batch writes the map."""
    root = Path(root)
    batch = _batches.get(root)
    if batch is not None:
        batch.register(conversation_id, agent, session)
        return
    with _MapLock(root):
        conv = _read_map(root)
        if conv is None:
            conv = _scan(root)
        if _kept(root, conv, conversation_id, agent, session):
            return
        conv[conversation_id] = {"session": session, "agent": agent}
        atomic_write(root / CONVERSATIONS, orjson.dumps({"version": 1, "conversations": conv}))


class MapBatch:
    """The map for one run that registers many conversations (``memfs import``): read once,
    its registrations kept here and written by :meth:`write` (merged under the lock into the
    map as it is then), not one whole rewrite per new session. Another process's
    registrations made meanwhile are seen by the next run (a lookup that misses one makes
    the same session name from the id: :func:`new_session_name`)."""

    def __init__(self, root: Path):
        self.root = root
        self.conv: dict | None = None  # the map as this run sees it (None: not read yet)
        self.loaded = False
        self.pending: dict[str, dict] = {}  # registered since the last write
        self.rebuild = False  # no map was there to read: the next write makes one

    def current(self) -> dict | None:
        if not self.loaded:
            self.conv, self.loaded = _read_map(self.root), True
        return self.conv

    def rebuilt(self, conv: dict) -> None:
        self.conv, self.loaded = dict(conv), True
        for cid, entry in self.pending.items():
            self.conv.setdefault(cid, entry)

    def register(self, conversation_id: str, agent: str | None, session: str) -> None:
        conv = self.current()
        if conv is None:  # (missing or unreadable: the write replaces it)
            conv = self.conv = _scan(self.root)
            self.rebuild = True
        if _kept(self.root, conv, conversation_id, agent, session):
            return
        conv[conversation_id] = self.pending[conversation_id] = {"session": session, "agent": agent}

    def write(self) -> None:
        """Merge the registrations held into the map on disk (atomic replace, under the lock)."""
        if not self.pending and not self.rebuild:
            return
        with _MapLock(self.root):
            conv = _read_map(self.root)
            if conv is None:
                conv = _scan(self.root)
            for cid, entry in self.pending.items():
                if not _kept(self.root, conv, cid, entry.get("agent"), entry["session"]):
                    conv[cid] = entry
            atomic_write(self.root / CONVERSATIONS, orjson.dumps({"version": 1, "conversations": conv}))
        self.pending.clear()
        self.rebuild = False


_batches: dict[Path, MapBatch] = {}  # root -> the batch in force (batched)


@contextmanager
def batched(root: Path) -> Iterator[MapBatch]:
    """Registrations under ``root`` are held in a :class:`MapBatch` (call its ``write`` at
    each point the map should be on disk) and written when the block ends."""
    root = Path(root)
    batch = _batches[root] = MapBatch(root)
    try:
        yield batch
    finally:
        del _batches[root]
        batch.write()


# --- project ------------------------------------------------------------------------------------

_projects: dict[str, str] = {}


def project_of(cwd: str) -> str:
    """The git top-level of ``cwd`` when it is a directory here inside a git work tree, else
    ``cwd`` itself (cached per ``cwd``)."""
    if cwd in _projects:
        return _projects[cwd]
    project = cwd
    if os.path.isabs(cwd) and os.path.isdir(cwd):
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        try:
            proc = subprocess.run(["git", "-C", cwd, "rev-parse", "--show-toplevel"], capture_output=True,
                                  timeout=GIT_TIMEOUT, env=env, stdin=subprocess.DEVNULL)
            top = proc.stdout.decode("utf-8", "replace").strip()
            if proc.returncode == 0 and top and os.path.isabs(top):
                project = top
        except (OSError, subprocess.SubprocessError):
            pass
    _projects[cwd] = project
    return project
