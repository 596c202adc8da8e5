"""Where the MCP server reads and writes: a store through the library (``--store``), or a
running mount through its files (``--mount``). Both answer the same calls with the same
reasons; every call is synchronous (the server runs it on a worker thread).

* :class:`StoreSource` opens sessions read-only for every read (SPEC §3.5: reads never take a
  session's lock, and follow other processes' appends) through one long-lived read-only
  :class:`~memfs.store.root.Store` (at most ``max_open_sessions`` open) and keeps one search
  index in step with it, as a mount does. ``append_note`` opens the session writable only for
  the append (the one commit path: :func:`memfs.store.batch.append_batch`), so the server holds
  a session's lock only while it writes and for ``idle_release`` seconds after (§3.5): a mount,
  ``memfs append`` and importers keep writing the same store, and a writer the server finds
  holding the lock is named in the refusal (``EBUSY``).
* :class:`MountSource` reads a store-wide mount's files (``sessions/<s>/derived/context.md?
  budget=N``, ``search/<query>?k=N``, …) and appends to its ``events.jsonl``; a refusal's reason
  is the mount's (``user.memfs.last_error``), else the errno's text.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from urllib.parse import quote

import orjson

from memfs.config import Config
from memfs.errors import InvalidName, MemfsError, NotFound
from memfs.mcp_server.args import AppendNoteArgs, GetUsageArgs, ListSessionsArgs, SearchArgs
from memfs.store import listing
from memfs.store.paths import EVENTS, MANIFEST, REJECTED, new_session_name_error, read_file, sanitize

MAX_RESULT_BYTES = 4 << 20  # a tool result or resource larger than this is refused (see docs/design.md)
INDEX_FILES = ("turns.json", "import-sources.json")
_FILE = re.compile(r"(events\.jsonl|manifest\.json|rejected\.jsonl|index/(?:turns|import-sources)\.json"
                   r"|derived/[A-Za-z0-9_-][A-Za-z0-9._-]*|derived/turns/[1-9][0-9]*\.jsonl)")


class ToolFailure(MemfsError):
    """A call refused with a one-line reason (the tool answers ``isError``)."""


def check_session(name: str) -> str:
    """``name`` when it can name a session (the ``mkdir`` check; an existing session whose
    name begins with ``-`` stays reachable, SPEC §6), else :class:`InvalidName`."""
    error = new_session_name_error(name)
    if error is not None and not (name == sanitize(name) and name.startswith("-") and len(name) <= 255):
        raise error
    return name


def check_file(file: str) -> str:
    """A session file's path as the mount names it (``manifest.json``, ``derived/context.md``,
    ``derived/turns/3.jsonl``…), else :class:`NotFound`."""
    if not _FILE.fullmatch(file) or ".." in file.split("/"):
        raise NotFound(f"no file {file[:80]!r} in a session (events.jsonl, manifest.json, rejected.jsonl, "
                       f"index/turns.json, derived/<view>, derived/turns/<n>.jsonl)")
    return file


def note_line(args: AppendNoteArgs) -> bytes:
    """The event line an ``append_note`` call asks for (validated by the store as any line)."""
    if (args.text is None) == (args.event is None):
        raise ToolFailure("append_note needs either text or event (one goal.* event object), not both")
    if args.event is not None:
        etype = args.event.get("type")
        if not (isinstance(etype, str) and etype.startswith("goal.")):
            raise ToolFailure(f"append_note: event must be a goal.* event (its type is {str(etype)[:40]!r}); "
                              f"write a note as text")
        return orjson.dumps(args.event)
    item = {"id": "mcp-note-" + os.urandom(6).hex(), "type": args.kind, "text": args.text}
    return orjson.dumps({"type": "item.completed", "item": item})


def _too_big(data: bytes, what: str) -> bytes:
    if len(data) > MAX_RESULT_BYTES:
        raise ToolFailure(f"{what} is {len(data)} bytes, over the {MAX_RESULT_BYTES >> 20} MiB an MCP result "
                          f"carries here; read it through a mount or the command line")
    return data


def turn_events(data: bytes) -> list[dict]:
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]


def since_of(args: GetUsageArgs | ListSessionsArgs) -> float | None:
    """A call's ``since`` in seconds since the epoch (None without one), else :class:`ToolFailure`."""
    if args.since is None:
        return None
    try:
        return listing.parse_since(args.since)
    except ValueError as exc:
        raise ToolFailure(f"since: {exc}") from None


def listing_filter(args: ListSessionsArgs) -> listing.Filter:
    return listing.Filter(args.agent, args.project, args.status, since_of(args))


def session_entries(root: Path, args: ListSessionsArgs) -> list[dict]:
    """``list_sessions``: the entries of ``memfs sessions --json`` (usage totals included), from
    the store catalog of ``root`` — for a store and a mount alike."""
    from memfs.usage.reporting import listed

    _, sessions, usage = listed(root, listing_filter(args), args.limit)
    return [listing.entry(s, usage.get(s.name)) for s in sessions]


def search_options(args: SearchArgs):
    """The §5.1 options of a call, validated by their one validator
    (:func:`memfs.search.options.parse_options`: :class:`BadQuery` with its reason)."""
    from memfs.search.options import parse_options

    return parse_options(args.options())


class StoreSource:
    """The store at ``config.sessions_root()``, through the library."""

    def __init__(self, config: Config):
        from memfs.search.searcher import store_searcher
        from memfs.store.root import Store, StoreSettings

        self.config = config
        self.root = config.sessions_root()
        if not self.root.is_dir():
            raise MemfsError(f"no store at {self.root} (a mistyped --store?)")
        self.store = Store(self.root, StoreSettings(read_only=True, max_open_sessions=config.max_open_sessions))
        self.searcher = store_searcher(self.store, max_results=config.search.max_results,
                                       min_score=config.search.min_score, defaults=config.search.params(),
                                       persist="load")  # the index the mount saved: a quick start
        self.describe = f"store {self.root}"

    def close(self) -> None:
        self.store.close()

    def handle(self, name: str):
        return self.store.open(check_session(name))

    def names(self) -> list[str]:
        return self.store.names()

    def sessions(self, args: ListSessionsArgs) -> list[dict]:
        return session_entries(self.root, args)

    def search(self, args: SearchArgs) -> list[dict]:
        search_options(args)  # (a bad option is refused before the store is touched)
        if args.session is not None:
            check_session(args.session)
        return self.searcher(args.query, None, None, None, args.options())  # over the config's [search]

    def context(self, name: str, budget: int) -> str:
        from memfs.views import context_markdown

        return context_markdown(self.handle(name), budget)

    def turn(self, name: str, n: int) -> bytes:
        from memfs.views import render_view

        return _too_big(render_view(self.handle(name), f"turns/{n}.jsonl"), f"turn {n}")

    def usage(self, args: GetUsageArgs) -> dict:
        from memfs.usage import periods, query, session_usage

        if args.session is not None:
            return session_usage(self.handle(args.session))
        # what `memfs usage --by BY --since … --json` prints (the local zone, ccusage's names beside memfs's)
        return query.report(Path(self.root), periods.Options(by=args.by, since=since_of(args)))

    def append(self, name: str, line: bytes) -> int:
        from memfs.store.batch import append_batch
        from memfs.store.session import open_session

        if not self.store.exists(check_session(name)):
            raise NotFound(f"no session {name!r} (append_note writes to an existing session)")
        c = self.config
        with open_session(self.root, name, create=False, durability=c.durability, max_events=c.max_events,
                          evict_to=c.evict_to, max_line_bytes=c.max_line_bytes,
                          idle_release=c.idle_release) as handle:
            result = append_batch(handle, [line], keep_going=False, stop_at_cap=True)
            size = handle.file_len
        if result.refused:
            raise ToolFailure(f"refused: {result.refused[0][1]} (recorded in rejected.jsonl)")
        if result.cap_error is not None:
            raise ToolFailure(f"appended, but {result.cap_error}")
        return size

    def files(self, name: str) -> list[str]:
        from memfs.views import VIEW_NAMES

        path = self.root / name
        names = [EVENTS, MANIFEST] + ([REJECTED] if (path / REJECTED).is_file() else [])
        names += [f"index/{f}" for f in INDEX_FILES if (path / "index" / f).is_file()]
        return names + [f"derived/{v}" for v in VIEW_NAMES]

    def read(self, name: str, file: str) -> bytes:
        from memfs.views import render_view

        handle = self.handle(name)
        file = check_file(file)
        if file == EVENTS:
            if handle.file_len > MAX_RESULT_BYTES:
                _too_big(b"x" * (MAX_RESULT_BYTES + 1), f"{name}/{EVENTS}")
            return handle.read_bytes(0, handle.file_len)
        if file == MANIFEST:
            return handle.reads.manifest_json()
        if file == "index/turns.json":
            return _too_big(handle.reads.turn_index_json(), f"{name}/{file}")
        if file.startswith("derived/"):
            try:
                return _too_big(render_view(handle, file[len("derived/"):]), f"{name}/{file}")
            except FileNotFoundError:
                raise NotFound(f"no file {file!r} in session {name!r}") from None
        try:
            return _too_big(read_file(self.root / name / file), f"{name}/{file}")
        except FileNotFoundError:
            raise NotFound(f"no file {file!r} in session {name!r}") from None


class MountSource:
    """A store-wide memfs mount at ``mountpoint``, through its files."""

    def __init__(self, mountpoint: str | os.PathLike, config: Config):
        self.config = config
        self.mnt = Path(mountpoint).resolve()
        self.sessions_dir = self.mnt / "sessions"
        if not os.path.ismount(self.mnt) or not self.sessions_dir.is_dir():
            raise MemfsError(f"{self.mnt} is not a store-wide memfs mount (a --session mount is served with "
                             f"--store, the store it shows)")
        self.describe = f"mount {self.mnt}"

    def close(self) -> None:
        pass

    def path(self, name: str) -> Path:
        path = self.sessions_dir / check_session(name)
        if not path.is_dir():
            raise NotFound(f"no session {name!r}")
        return path

    def _read(self, path: Path, what: str) -> bytes:
        try:
            with open(path, "rb") as f:  # the mount serves dynamic files whole (direct_io)
                data = f.read(MAX_RESULT_BYTES + 1)
        except OSError as exc:
            raise self._failure(exc, what, path.parent) from None
        return _too_big(data, what)

    def _failure(self, exc: OSError, what: str, session_dir: Path | None = None) -> MemfsError:
        told = None
        if session_dir is not None and exc.errno in (errno.EBADMSG, errno.EFBIG, errno.EBUSY, errno.EINVAL):
            try:
                told = os.getxattr(session_dir, "user.memfs.last_error").decode(errors="replace")
            except OSError:
                pass
        if exc.errno == errno.ENOENT:
            return NotFound(f"no {what}")
        return ToolFailure(f"{what}: {told or os.strerror(exc.errno or errno.EIO)}")

    def sessions(self, args: ListSessionsArgs) -> list[dict]:
        """The mount's store catalog, read where the mount names its store (``user.memfs.store``
        on its root): the same entries as ``--store`` (``memfs sessions --json``)."""
        try:
            store = Path(os.fsdecode(os.getxattr(self.mnt, "user.memfs.store")))
        except OSError as exc:
            raise ToolFailure(f"list_sessions: the mount does not name its store ({os.strerror(exc.errno or 0)}); "
                              f"serve the store (--store)") from None
        if not store.is_dir():
            raise ToolFailure(f"list_sessions: the mount's store {store} is not readable here; serve it (--store)")
        return session_entries(store, args)

    def search(self, args: SearchArgs) -> list[dict]:
        search_options(args)  # refused here with the option's reason, before the mount is asked
        params = args.options()
        where = self.mnt
        if "session" in params:
            where = self.path(params.pop("session"))
        if not args.query.strip():
            raise NotFound("no search terms in ''")
        name = quote(args.query, safe=" ") + ("?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in params.items())
                                              if params else "")
        data = self._read(where / "search" / name, f"search {args.query[:80]!r}")
        return [orjson.loads(line) for line in data.splitlines()]

    def context(self, name: str, budget: int) -> str:
        return self._read(self.path(name) / "derived" / f"context.md?budget={budget}", "context.md").decode()

    def turn(self, name: str, n: int) -> bytes:
        return self._read(self.path(name) / "derived" / "turns" / f"{n}.jsonl", f"turn {n} in session {name!r}")

    def usage(self, args: GetUsageArgs) -> dict:
        if args.session is not None:
            return orjson.loads(self._read(self.path(args.session) / "derived" / "usage.json", "usage.json"))
        from memfs.usage.aggregate import FILES

        stem = {by: stem for stem, by in FILES.items()}.get(args.by)
        if stem is None or args.since is not None:
            raise ToolFailure(f"a mount's usage/ has the report by {', '.join(FILES.values())} without since; "
                              f"serve the store (--store) for by={args.by}" + (" with since" if args.since else ""))
        return orjson.loads(self._read(self.mnt / "usage" / f"{stem}.json", f"usage/{stem}.json"))

    def append(self, name: str, line: bytes) -> int:
        path = self.path(name)
        try:
            fd = os.open(path / EVENTS, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            raise self._failure(exc, f"session {name!r}", path) from None
        try:
            os.write(fd, line + b"\n")
            return os.fstat(fd).st_size
        except OSError as exc:
            raise self._failure(exc, "refused", path) from None
        finally:
            try:
                os.close(fd)
            except OSError:
                pass

    def files(self, name: str) -> list[str]:
        path = self.sessions_dir / name
        names = [EVENTS, MANIFEST] + ([REJECTED] if (path / REJECTED).exists() else [])
        names += [f"index/{f}" for f in INDEX_FILES if (path / "index" / f).exists()]
        return names + [f"derived/{v}" for v in sorted(os.listdir(path / "derived")) if v != "turns"]

    def read(self, name: str, file: str) -> bytes:
        return self._read(self.path(name) / check_file(file), f"{name}/{file}")

    def names(self) -> list[str]:
        return sorted(os.listdir(self.sessions_dir))


__all__ = ["InvalidName", "MountSource", "StoreSource", "ToolFailure", "check_file", "check_session", "note_line",
           "turn_events"]
