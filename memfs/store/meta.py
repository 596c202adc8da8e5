"""Session metadata on disk: ``manifest.json``, ``index/turns.json`` and the cap-rewrite marker
(SPEC §1.1, §1.2, §3.7) — (de)serialization and the checks the open fast path relies on.

The turn index is kept in columns (``array('q')``) rather than one object per turn, so a
rescan of a 1 GB log holds a few bytes per turn; closed entries never change, so their JSON is
rendered once and reused on every persist (after an open, the bytes of the ``turns.json`` just
read are reused instead of rendering them again), and a persist on another thread writes them
while appends go on (:class:`IndexSnapshot`).

``index/turns.cache`` (a memfs extension, decision recorded here): parsing a 100,000-turn
``turns.json`` takes longer than the open budget (50 ms), so when the index has at least
:data:`CACHE_MIN_ENTRIES` entries a binary copy of its columns is written right after
``turns.json``. It names the exact ``turns.json`` it was written after (inode, size, mtime,
ctime); open uses it only when that file is still the same one, and otherwise reads
``turns.json`` itself. Deleting it loses nothing. Its columns carry a CRC-32, and it is only
ever written from an in-memory index that is consistent by construction (the state machine's
offsets only grow) — so the per-entry checks of §3.3 hold for it without running them again
at open; the checks that tie the index to the manifest and the log still run.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from operator import lt

import orjson

# Outcome codes of index entries. UNKNOWN: an index written by another writer without
# an ``outcome`` field.
OPEN, COMPLETED, FAILED, ABANDONED, UNKNOWN = range(5)
OUTCOME_NAMES = ("open", "completed", "failed", "abandoned", None)
_OUTCOME_CODES = {name: code for code, name in enumerate(OUTCOME_NAMES) if name}


def format_rfc3339(epoch: float) -> str:
    """RFC 3339 UTC with milliseconds and a ``+00:00`` offset, as manifests carry."""
    return _dt.datetime.fromtimestamp(epoch, _dt.UTC).isoformat(timespec="milliseconds")


def now_rfc3339() -> str:
    """The current time as :func:`format_rfc3339` renders it."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="milliseconds")


def parse_rfc3339(text: str) -> float | None:
    """Seconds since the epoch for any RFC 3339 timestamp, or None when unparsable."""
    try:
        value = _dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except (ValueError, AttributeError, TypeError):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.UTC)
    return value.timestamp()


@dataclass(slots=True)
class Manifest:
    """``manifest.json``. The last three fields are optional on read (older writers)."""

    session_id: str
    created_at: str
    updated_at: str
    turn_count: int = 0
    event_count: int = 0
    status: str = "active"
    in_turn: bool = False
    persisted_file_len: int = 0
    retained_turn_base: int = 1
    schema_version: int = 1

    def to_dict(self) -> dict:
        # Spelled out: dataclasses.asdict deep-copies and costs more than the rest of a stat.
        return {
            "session_id": self.session_id,
            "schema_version": self.schema_version,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "turn_count": self.turn_count,
            "event_count": self.event_count,
            "status": self.status,
            "in_turn": self.in_turn,
            "persisted_file_len": self.persisted_file_len,
            "retained_turn_base": self.retained_turn_base,
        }

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())


@dataclass(slots=True)
class ManifestRead:
    """What could be read of a manifest on disk.

    ``manifest`` holds every field that was present and well-typed (defaults elsewhere);
    ``complete`` is True only when all fields, including the optional three, were.
    """

    manifest: Manifest
    complete: bool
    has_turn_count: bool
    has_base: bool = False


_INT_FIELDS = ("turn_count", "event_count", "persisted_file_len", "retained_turn_base")


def read_manifest(data: bytes, fallback_id: str) -> ManifestRead | None:
    """Parse manifest bytes leniently; None when they are not a JSON object at all."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict:
        return None
    now = now_rfc3339()
    m = Manifest(session_id=fallback_id, created_at=now, updated_at=now)
    complete = True
    for name in ("session_id", "created_at", "updated_at"):
        if type(obj.get(name)) is str:
            setattr(m, name, obj[name])
        else:
            complete = False
    for name in _INT_FIELDS:
        value = obj.get(name)
        if type(value) is int and value >= 0:
            setattr(m, name, value)
        else:
            complete = False
    if obj.get("status") in ("active", "completed"):
        m.status = obj["status"]
    else:
        complete = False
    if type(obj.get("in_turn")) is bool:
        m.in_turn = obj["in_turn"]
    else:
        complete = False
    if m.retained_turn_base < 1:
        complete = False
    has_turn_count = type(obj.get("turn_count")) is int and obj["turn_count"] >= 0
    has_base = type(obj.get("retained_turn_base")) is int and obj["retained_turn_base"] >= 1
    return ManifestRead(m, complete, has_turn_count, has_base)


CACHE_MIN_ENTRIES = 2048
_CACHE_MAGIC = b"memfs turns.cache 1\n"
_ENTRIES_HEAD = b'{"entries":['
_ENTRIES_TAIL = b"]}"
_ENTRY_HEAD = b',{"turn_number":'


def file_key(st: os.stat_result) -> list[int]:
    """What identifies one version of a file that is only ever replaced by rename."""
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class TurnIndex:
    """The byte-offset turn index: entry ``i`` is turn ``base + i``.

    Only the last entry may be open (``outcome == OPEN``); it is extended in place as
    events arrive. Closed entries are immutable.
    """

    __slots__ = ("base", "start", "end", "count", "_ts", "_ts_blob", "outcome", "_json", "_json_n",
                 "json_source", "_source_shape", "entries_checked")

    def __init__(self, base: int = 1):
        self.base = base
        self.start = array("q")
        self.end = array("q")
        self.count = array("q")
        self._ts: list[str] | None = []
        self._ts_blob = b""  # the ts column as read from a cache, split on first use
        self.outcome = bytearray()
        self._json = bytearray()  # rendered JSON of entries [0, _json_n), comma-joined
        self._json_n = 0
        # returns the bytes of the turns.json these entries were read from (None when it is
        # gone or changed): used once, to reuse the closed entries' JSON instead of rendering
        self.json_source: Callable[[], bytes | None] | None = None
        self._source_shape = (0, 0)  # (entries, closed entries) when json_source was set
        # True when the entries come from a turns.cache: their own order was checked when the
        # in-memory index they copy was built (see the module docstring)
        self.entries_checked = False

    def __len__(self) -> int:
        return len(self.start)

    @property
    def ts(self) -> list[str]:
        """The ``ts`` column (creation time of each entry)."""
        if self._ts is None:
            self._ts = zlib.decompress(self._ts_blob).decode().split("\n") if self.start else []
            self._ts_blob = b""
        return self._ts

    @ts.setter
    def ts(self, value: list[str]) -> None:
        self._ts, self._ts_blob = value, b""

    @property
    def last_ordinal(self) -> int:
        """Ordinal of the last entry (``base - 1`` when empty)."""
        return self.base + len(self.start) - 1

    def position(self, ordinal: int) -> int | None:
        """Entry position of turn ``ordinal``, or None when it is not retained."""
        i = ordinal - self.base
        return i if 0 <= i < len(self.start) else None

    def entry(self, i: int) -> dict:
        d = {
            "turn_number": self.base + i,
            "start_offset": self.start[i],
            "end_offset": self.end[i],
            "event_count": self.count[i],
            "ts": self.ts[i],
        }
        name = OUTCOME_NAMES[self.outcome[i]]
        if name is not None:
            d["outcome"] = name
        return d

    def entries(self) -> list[dict]:
        return [self.entry(i) for i in range(len(self.start))]

    def open_turn(self, start: int, end: int, ts: str) -> None:
        self.start.append(start)
        self.end.append(end)
        self.count.append(1)
        self.ts.append(ts)
        self.outcome.append(OPEN)

    def set_json_source(self, source: Callable[[], bytes | None]) -> None:
        """Where to find the ``turns.json`` these entries were just read from (see to_json)."""
        self.json_source = source
        self._source_shape = (len(self.start), self.closed_count())

    def mark_last_open(self) -> None:
        """The last entry is the open turn (the manifest says ``in_turn``): JSON adopted for it
        as a closed entry (an index of another writer has no outcomes) is dropped."""
        n = len(self.start)
        self.outcome[-1] = OPEN
        if self._json_n >= n:
            self._json, self._json_n = bytearray(), 0
        entries, closed = self._source_shape
        self._source_shape = (entries, min(closed, entries - 1))

    def _forget_json(self) -> None:
        self._json, self._json_n, self.json_source = bytearray(), 0, None

    def rebase(self, base: int) -> None:
        """Renumber the entries to start at ``base``."""
        self.base = base
        self._forget_json()

    def drop_front(self, k: int, shift: int) -> None:
        """Forget the first ``k`` entries and move every offset ``shift`` bytes down."""
        self.base += k
        self.start = array("q", (s - shift for s in self.start[k:]))
        self.end = array("q", (e - shift for e in self.end[k:]))
        del self.count[:k]
        del self.ts[:k]
        del self.outcome[:k]
        self._forget_json()

    def closed_count(self) -> int:
        """How many leading entries are closed (all but an open last one)."""
        n = len(self.start)
        return n - 1 if n and self.outcome[-1] == OPEN else n

    def to_json(self) -> bytes:
        """``{"entries":[...]}``, rendering only entries closed since the last call."""
        return self.snapshot().json()

    def snapshot(self, cache: bool = False) -> IndexSnapshot:
        """The index as it is now, to write later — also from another thread while this index
        goes on changing (see :class:`IndexSnapshot`). Renders only entries closed since the
        last call. ``cache``: also take what ``turns.cache`` needs (a copy of the columns)."""
        n = len(self.start)
        closed = self.closed_count()
        if self.json_source is not None:
            source, self.json_source = self.json_source, None
            if self._json_n == 0:
                self._adopt_json(source(), *self._source_shape)
        if closed < self._json_n:  # an entry was reopened: cannot happen, but stay correct
            self._json, self._json_n = bytearray(), 0
        for i in range(self._json_n, closed):
            if self._json:
                self._json += b","
            self._json += orjson.dumps(self.entry(i))
        self._json_n = closed
        tail = b""
        if closed < n:
            tail = (b"," if self._json else b"") + orjson.dumps(self.entry(n - 1))
        columns = None
        if cache:
            columns = (n, self.base, b"".join((self.start.tobytes(), self.end.tobytes(), self.count.tobytes(),
                                                self.outcome)), self.ts[:])
        return IndexSnapshot(self._json, len(self._json), tail + _ENTRIES_TAIL, columns)

    def _adopt_json(self, data: bytes | None, n: int, closed: int) -> None:
        """Take the JSON of the first ``closed`` entries from ``data``, a ``turns.json`` that
        holds exactly the first ``n`` of these entries (only the last may be open), when it is
        in the compact form memfs writes."""
        if not data or not closed or closed < n - 1 or not data.startswith(_ENTRIES_HEAD) \
                or not data.endswith(_ENTRIES_TAIL):
            return
        body = memoryview(data)[len(_ENTRIES_HEAD) : -len(_ENTRIES_TAIL)]
        if closed < n:  # cut the open last entry off, and make sure that is what was cut
            cut = data.rfind(_ENTRY_HEAD, 0, len(data) - len(_ENTRIES_TAIL)) - len(_ENTRIES_HEAD)
            if cut < 0:
                return
            try:
                last = orjson.loads(body[cut + 1 :])
            except orjson.JSONDecodeError:
                return
            if type(last) is not dict or last.get("turn_number") != self.base + n - 1:
                return
            body = body[:cut]
        self._json, self._json_n = bytearray(body), closed

    @classmethod
    def parse(cls, data: bytes) -> TurnIndex | None:
        """Parse ``turns.json``; None when it is not well-formed (wrong shape or types)."""
        try:
            obj = orjson.loads(data)
            entries = obj["entries"]
            if type(entries) is not list:
                return None
            numbers = [e["turn_number"] for e in entries]
            columns = ([e["start_offset"] for e in entries], [e["end_offset"] for e in entries],
                       [e["event_count"] for e in entries])
            idx = cls(numbers[0] if numbers else 1)
            idx.start, idx.end, idx.count = (array("q", c) for c in columns)
            idx.ts = [ts if type(ts := e.get("ts", "")) is str else "" for e in entries]
            idx.outcome = bytearray(_OUTCOME_CODES.get(e.get("outcome"), UNKNOWN) for e in entries)
        except (orjson.JSONDecodeError, KeyError, TypeError, OverflowError, IndexError, AttributeError):
            return None
        # array('q') refuses floats and strings but takes bools: JSON true is not an offset
        if any(type(x) is not int for column in (numbers, *columns) for x in column):
            return None
        if numbers != list(range(idx.base, idx.base + len(numbers))):
            return None
        idx._adopt_json(data, len(idx), idx.closed_count())
        return idx

    @classmethod
    def from_cache(cls, data: bytes, key: list[int]) -> TurnIndex | None:
        """Entries from ``turns.cache`` bytes, or None unless they were written after the
        ``turns.json`` whose :func:`file_key` is ``key``."""
        if not data.startswith(_CACHE_MAGIC):
            return None
        nl = data.find(b"\n", len(_CACHE_MAGIC))
        try:
            header = orjson.loads(data[len(_CACHE_MAGIC) : nl])
            n, base, size = header["n"], header["base"], header["bytes"]
            if header["key"] != key or header["order"] != sys.byteorder:
                return None
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None
        pos = nl + 1
        if type(n) is not int or type(base) is not int or len(data) != pos + size or size < 25 * n:
            return None
        if zlib.crc32(memoryview(data)[pos:]) != header.get("crc32"):
            return None
        idx = cls(base)
        idx.entries_checked = True
        for name in ("start", "end", "count"):
            column = array("q")
            column.frombytes(data[pos : pos + 8 * n])
            setattr(idx, name, column)
            pos += 8 * n
        idx.outcome = bytearray(data[pos : pos + n])
        idx._ts, idx._ts_blob = None, data[pos + n :]
        return idx

    def consistent_with(self, manifest: Manifest, file_len: int) -> bool:
        """The §3.3 checks on entries: positive counts, ordered non-overlapping offsets within
        the file, ordinals contiguous from ``retained_turn_base`` to ``turn_count`` (+1 open).

        Also (decision recorded here): only an open last entry may be ``open`` and only when
        the manifest says ``in_turn``; an open turn ends at the end of the log (every line
        after ``turn.started`` extends it); the entries hold no more events than the log.
        """
        n = len(self.start)
        in_turn = manifest.in_turn
        last = manifest.turn_count + (1 if in_turn else 0)
        if n == 0:
            return not in_turn and manifest.retained_turn_base == last + 1
        if self.base != manifest.retained_turn_base or self.last_ordinal != last:
            return False
        first_open = self.outcome.find(OPEN)
        if first_open >= 0 and not (in_turn and first_open == n - 1):
            return False
        if in_turn and self.end[-1] != file_len:
            return False
        count = self.count
        if sum(count) > manifest.event_count or self.start[0] < 0 or self.end[-1] > file_len:
            return False
        if self.entries_checked:
            return True
        if min(count) <= 0:
            return False
        start, end = self.start, self.end
        if not all(map(lt, start, end)):
            return False
        # each turn starts at or after the previous one's end: start[1:] >= end[:-1]
        return not any(map(lt, memoryview(start)[1:], memoryview(end)[:-1]))


_SLICE = 1 << 20  # an IndexSnapshot copies its buffer this much at a time


class IndexSnapshot:
    """``turns.json`` (and what ``turns.cache`` needs) of a :class:`TurnIndex` as it was when
    :meth:`TurnIndex.snapshot` took it: cheap to take under the session's lock, and safe to
    write after the lock is released while appends go on changing the index.

    The JSON of closed entries is only ever appended to the index's buffer — every other
    change (eviction, renumbering, a reopened entry) gives the index a *new* buffer — so the
    first ``size`` bytes of the buffer object stay what they were: the snapshot keeps the
    object and that size instead of a copy. Writing copies slices of it (a bytearray slice is
    copied under the GIL without exporting the buffer; a held ``memoryview`` would make the
    index's next ``+=`` fail with ``BufferError``), at most :data:`_SLICE` bytes at a time.
    """

    __slots__ = ("_buf", "_size", "_tail", "_columns")

    def __init__(self, buf: bytearray, size: int, tail: bytes, columns: tuple | None):
        self._buf = buf
        self._size = size
        self._tail = tail  # the open entry's JSON, if any, and the closing bracket
        self._columns = columns  # (n, base, packed columns, ts list) when taken with ``cache``

    def json_pieces(self) -> Iterator[bytes | bytearray]:
        """The ``turns.json`` bytes, in pieces to write one after the other."""
        buf, size = self._buf, self._size
        if size <= _SLICE:
            yield b"".join((_ENTRIES_HEAD, buf[:size], self._tail))
            return
        yield _ENTRIES_HEAD
        for pos in range(0, size, _SLICE):
            yield buf[pos : min(size, pos + _SLICE)]
        yield self._tail

    def json(self) -> bytes:
        """The ``turns.json`` bytes in one piece."""
        return b"".join(self.json_pieces())

    @property
    def has_cache(self) -> bool:
        return self._columns is not None

    def cache_bytes(self, key: list[int]) -> bytes | None:
        """The ``turns.cache`` bytes for these entries, written after the ``turns.json``
        whose :func:`file_key` is ``key``; None when a ``ts`` cannot be stored (or the snapshot
        was taken without ``cache``)."""
        if self._columns is None:
            return None
        n, base, packed, ts = self._columns
        if any("\n" in t for t in ts):
            return None
        payload = b"".join((packed, zlib.compress("\n".join(ts).encode(), 1)))
        header = {"key": key, "n": n, "base": base, "order": sys.byteorder,
                  "bytes": len(payload), "crc32": zlib.crc32(payload)}
        return b"".join((_CACHE_MAGIC, orjson.dumps(header), b"\n", payload))


@dataclass(slots=True)
class CapMarker:
    """``index/pending-cap-rewrite.json``: a cap rewrite in flight (SPEC §3.7)."""

    previous_file_len: int
    new_file_len: int
    retained_turn_base: int

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def parse(cls, data: bytes) -> CapMarker | None:
        try:
            obj = orjson.loads(data)
            values = [obj[k] for k in ("previous_file_len", "new_file_len", "retained_turn_base")]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None
        if any(type(v) is not int for v in values):
            return None
        return cls(*values)

    def matches(self, file_len: int) -> bool:
        """The rewrite happened (the file has the new length) but metadata may be stale."""
        return self.new_file_len == file_len and self.new_file_len < self.previous_file_len
