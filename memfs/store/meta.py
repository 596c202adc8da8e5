"""Session metadata on disk: ``manifest.json``, ``index/turns.json`` and the cap-rewrite marker
(SPEC §1.1, §1.2, §3.7) — (de)serialization and the checks the open fast path relies on.

The turn index is kept in columns (``array('q')``) rather than one object per turn, so a
rescan of a 1 GB log holds a few bytes per turn; closed entries never change, so their JSON is
rendered once and reused on every persist.
"""

from __future__ import annotations

import datetime as _dt
from array import array
from dataclasses import asdict, dataclass

import orjson

# Outcome codes of index entries. UNKNOWN: an index written by another writer without
# an ``outcome`` field.
OPEN, COMPLETED, FAILED, ABANDONED, UNKNOWN = range(5)
OUTCOME_NAMES = ("open", "completed", "failed", "abandoned", None)
_OUTCOME_CODES = {name: code for code, name in enumerate(OUTCOME_NAMES) if name}


def format_rfc3339(epoch: float) -> str:
    """RFC 3339 UTC with milliseconds and a ``+00:00`` offset, as manifests carry."""
    return _dt.datetime.fromtimestamp(epoch, _dt.timezone.utc).isoformat(timespec="milliseconds")


def now_rfc3339() -> str:
    """The current time as :func:`format_rfc3339` renders it."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def parse_rfc3339(text: str) -> float | None:
    """Seconds since the epoch for any RFC 3339 timestamp, or None when unparsable."""
    try:
        value = _dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except (ValueError, AttributeError, TypeError):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
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
        d = asdict(self)
        return {"session_id": d.pop("session_id"), "schema_version": d.pop("schema_version"), **d}

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
    return ManifestRead(m, complete, has_turn_count)


class TurnIndex:
    """The byte-offset turn index: entry ``i`` is turn ``base + i``.

    Only the last entry may be open (``outcome == OPEN``); it is extended in place as
    events arrive. Closed entries are immutable.
    """

    __slots__ = ("base", "start", "end", "count", "ts", "outcome", "_json", "_json_n")

    def __init__(self, base: int = 1):
        self.base = base
        self.start = array("q")
        self.end = array("q")
        self.count = array("q")
        self.ts: list[str] = []
        self.outcome = bytearray()
        self._json = bytearray()  # rendered JSON of entries [0, _json_n), comma-joined
        self._json_n = 0

    def __len__(self) -> int:
        return len(self.start)

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

    def rebase(self, base: int) -> None:
        """Renumber the entries to start at ``base``."""
        self.base = base
        self._json, self._json_n = bytearray(), 0

    def drop_front(self, k: int, shift: int) -> None:
        """Forget the first ``k`` entries and move every offset ``shift`` bytes down."""
        self.base += k
        self.start = array("q", (s - shift for s in self.start[k:]))
        self.end = array("q", (e - shift for e in self.end[k:]))
        del self.count[:k]
        del self.ts[:k]
        del self.outcome[:k]
        self._json = bytearray()
        self._json_n = 0

    def to_json(self) -> bytes:
        """``{"entries":[...]}``, rendering only entries closed since the last call."""
        n = len(self.start)
        closed = n - 1 if n and self.outcome[-1] == OPEN else n
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
        return b'{"entries":[' + bytes(self._json) + tail + b"]}"

    @classmethod
    def parse(cls, data: bytes) -> TurnIndex | None:
        """Parse ``turns.json``; None when it is not well-formed (wrong shape or types)."""
        try:
            obj = orjson.loads(data)
            entries = obj["entries"]
            if type(entries) is not list:
                return None
            numbers = [e["turn_number"] for e in entries]
            idx = cls(numbers[0] if numbers else 1)
            idx.start = array("q", [e["start_offset"] for e in entries])
            idx.end = array("q", [e["end_offset"] for e in entries])
            idx.count = array("q", [e["event_count"] for e in entries])
            idx.ts = [e.get("ts", "") for e in entries]
            idx.outcome = bytearray(_OUTCOME_CODES.get(e.get("outcome"), UNKNOWN) for e in entries)
        except (orjson.JSONDecodeError, KeyError, TypeError, OverflowError, IndexError):
            return None
        # array('q') accepts only ints (bools are ints too: refuse them explicitly)
        if any(type(x) is not int for x in numbers):
            return None
        if numbers != list(range(idx.base, idx.base + len(numbers))):
            return None
        return idx

    def consistent_with(self, manifest: Manifest, file_len: int) -> bool:
        """The §3.3 checks on entries: positive counts, ordered non-overlapping offsets within
        the file, ordinals contiguous from ``retained_turn_base`` to ``turn_count`` (+1 open)."""
        n = len(self.start)
        last = manifest.turn_count + (1 if manifest.in_turn else 0)
        if n == 0:
            return manifest.retained_turn_base == last + 1
        if self.base != manifest.retained_turn_base or self.last_ordinal != last:
            return False
        if min(self.count) <= 0:
            return False
        prev_end = 0
        for s, e in zip(self.start, self.end):
            if s < prev_end or e < s:
                return False
            prev_end = e
        return prev_end <= file_len


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
