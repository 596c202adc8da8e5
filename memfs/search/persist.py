"""The root search index saved in the store, so a restart does not re-read every log (SPEC §14).

One file per saved index, ``<root>/.search-index/<stem>-<stopwords>-<facts|facts+output>.idx``
(a hidden folder: never a session), replaced atomically (:func:`memfs.store.paths.atomic_write`)::

    MAGIC | header length (8 bytes, little endian) | header (JSON) | arrays (each 8-aligned)

The header holds :data:`FORMAT`, the analysis the index was made with, the CRC-32 of the
arrays, their names, dtypes and lengths, and the vocabulary's tokens. The arrays are the index's
columns (:meth:`memfs.search.SearchIndex.snapshot`), its postings concatenated, the facts'
texts (one UTF-8 blob), turns and offsets, each session slot's name, id, ``created_at``, source,
token total and fact count, and each session's log key when it was indexed
(:func:`memfs.search.changes.log_key`) — per session a row of columns, not a JSON object, so a
load at 100,000 sessions makes no object per value it reads past the ones the index keeps.

Decisions recorded here:

* A file that cannot be read, of another :data:`FORMAT`, of another analysis, or whose arrays
  do not match their CRC or their counts, is ignored (and logged): the index is rebuilt from
  the logs, and the next save replaces the file. It is a cache: deleting it loses nothing.
* A loaded session is trusted while its log key is the one saved with it; the searcher
  re-reads only the sessions whose key moved, and drops those gone.
* The header also holds the store catalog's change-feed cursor up to which the keys are
  current (when the index had nothing left to read at the save): a loader asks the feed only
  for what changed since, not for every session's key. A catalog made again since answers
  with every row (another generation), as without a cursor.
* Facts are not turned into Python objects at load: each session's are a :class:`SavedFacts`
  over the arrays read from the file, read when a result or an update needs them. Each array is
  read into its own memory (never the whole file at once: a load's peak is what the index keeps,
  plus one array).
"""

from __future__ import annotations

import logging
import os
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, overload

import orjson

from memfs.errors import MemfsError
from memfs.search.index import SearchIndex
from memfs.search.numpy_once import np
from memfs.store.catalog import pack_key, unpack_key
from memfs.store.paths import atomic_write, ensure_private_dir, open_nofollow, write_all

log = logging.getLogger("memfs.search")

FORMAT = 3
MAGIC = b"memfs search index\n"
DIR = ".search-index"
NONE = -(2**63)  # a fact's turn or offset that is null

_INT32 = ("doc_len", "doc_slot", "doc_local", "doc_turn", "slot_session", "postings", "gids")
_INT64 = ("token_ends", "text_ends", "fact_turn", "fact_offset", "slot_total", "slot_n", "key_size", "key_mtime",
          "name_ends", "sid_ends", "key_name_ends", "id_name_ends")
_INT8 = ("slot_live", "slot_source", "key_none")
SOURCES = ("session", "output", "prompt")
_ALIGN = 8


def index_path(root: str | os.PathLike, label: str) -> Path:
    """Where the index ``label`` (``"none-none-facts"``) of the store at ``root`` is saved."""
    return Path(root) / DIR / f"{label}.idx"


def _ints(values: list, what: str) -> np.ndarray:
    if any(v is not None and type(v) is not int for v in values):
        raise ValueError(f"a fact's {what} is not an integer")
    return np.array([NONE if v is None else v for v in values], dtype=np.int64)


def _strings(values: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Strings as one UTF-8 blob and their ends (in characters of the decoded blob)."""
    blob = np.frombuffer("".join(values).encode("utf-8", "surrogatepass"), dtype=np.uint8)
    return blob, np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)))


def _unstrings(blob: np.ndarray, ends: np.ndarray) -> list[str]:
    """What :func:`_strings` packed, each interned (one str per session name in the process)."""
    text = str(memoryview(blob), "utf-8", "surrogatepass")
    bounds = [0, *ends.tolist()]
    if bounds[-1] != len(text):
        raise ValueError("its strings do not match their ends")
    intern = sys.intern
    return [intern(text[bounds[i]: bounds[i + 1]]) for i in range(len(ends))]


def encode(state: dict, label: str, keys: dict[str, Any], cursor: int | None = None) -> list[bytes | memoryview]:
    """The file's bytes (as pieces) for an index ``state`` (:meth:`SearchIndex.snapshot`)."""
    texts: list[str] = []
    turns: list = []
    offsets: list = []
    gids: list[bytes] = []
    slots: list[tuple] = []
    for entry in state["slots"]:
        if entry is None:
            slots.append((0, "", "", None, 0, 0, 0))
            continue
        name, session_id, created_at, source, total_len, (facts, n), gid_bytes = entry
        for text, turn, offset in facts[:n]:
            texts.append(text)
            turns.append(turn)
            offsets.append(offset)
        gids.append(gid_bytes)
        slots.append((1, name, session_id, created_at, SOURCES.index(source), total_len, n))
    live, names, sids, created, sources, totals, counts = zip(*slots) if slots else ((),) * 7
    arrays = dict(state["columns"])
    arrays["postings"] = np.frombuffer(state["postings"], dtype=np.int32)
    arrays["token_ends"] = np.asarray(state["token_ends"], dtype=np.int64)
    arrays["gids"] = np.frombuffer(b"".join(gids), dtype=np.int32)
    arrays["text"] = np.frombuffer("".join(texts).encode("utf-8", "surrogatepass"), dtype=np.uint8)
    arrays["text_ends"] = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
    arrays["fact_turn"] = _ints(turns, "turn")
    arrays["fact_offset"] = _ints(offsets, "offset")
    arrays["slot_live"], arrays["slot_source"] = np.array(live, dtype=np.int8), np.array(sources, dtype=np.int8)
    arrays["slot_created"] = np.array([np.nan if c is None else c for c in created], dtype=np.float64)
    arrays["slot_total"], arrays["slot_n"] = np.array(totals, dtype=np.int64), np.array(counts, dtype=np.int64)
    arrays["names"], arrays["name_ends"] = _strings(list(names))
    arrays["sids"], arrays["sid_ends"] = _strings(list(sids))
    arrays["id_names"], arrays["id_name_ends"] = _strings(list(state["session_ids"]))
    arrays["key_names"], arrays["key_name_ends"] = _strings(list(keys))
    key_values = [(0, 0, 0) if k is None else unpack_key(k) for k in keys.values()]
    arrays["key_none"] = np.array([k is None for k in keys.values()], dtype=np.int8)
    for i, (column, dtype) in enumerate((("key_ino", np.uint64), ("key_size", np.int64), ("key_mtime", np.int64))):
        arrays[column] = np.array([k[i] for k in key_values], dtype=dtype)  # (an inode number may pass 2**63)
    body: list[bytes | memoryview] = []
    listed = []
    crc = 0
    for name, arr in arrays.items():
        data = np.ascontiguousarray(arr).data.cast("B")
        pad = -len(data) % _ALIGN
        body += [data, b"\0" * pad]
        crc = zlib.crc32(b"\0" * pad, zlib.crc32(data, crc))
        listed.append([name, arr.dtype.str, len(arr)])
    header = orjson.dumps({"format": FORMAT, "analysis": label, "crc32": crc, "arrays": listed,
                           "tokens": state["tokens"], "live_docs": state["live_docs"], "live_len": state["live_len"],
                           "dead_docs": state["dead_docs"],
                           "cursor": str(cursor) if cursor is not None else None})  # (past 64 bits: text)
    header += b" " * (-(len(MAGIC) + 8 + len(header)) % _ALIGN)
    return [MAGIC, len(header).to_bytes(8, "little"), header, *body]


def save(root: str | os.PathLike, label: str, state: dict, keys: dict[str, Any], cursor: int | None = None) -> Path:
    """Write the index ``label``'s ``state`` and the sessions' log ``keys`` atomically;
    ``cursor``: the store catalog's change feed's cursor (:meth:`memfs.store.catalog.Catalog.changes_since`)
    up to which every change is in ``keys``, when there is one."""
    path = index_path(root, label)
    pieces = encode(state, label, keys, cursor)
    ensure_private_dir(path.parent)

    def write(fd: int) -> None:
        for piece in pieces:
            write_all(fd, piece)

    atomic_write(path, write)
    return path


def _within(values: np.ndarray, end: int, start: int = 0) -> bool:
    """Every value in ``[start, end)`` (an index the arrays use stays inside what it indexes)."""
    return not len(values) or (int(values.min()) >= start and int(values.max()) < end)


_DTYPES = frozenset(("<i4", "<i8", "<u8", "|i1", "|u1", "<f8"))  # what encode writes (little-endian)


def _read(fd: int, label: str) -> tuple[dict, dict[str, Any]]:
    """The header and the arrays of an open index file, each array read into memory of its own
    (no buffer of the whole file held meanwhile); ValueError when it is not a whole,
    current-format file of this analysis."""
    def pread(n: int, at: int, into: memoryview | None = None) -> memoryview:
        buf = memoryview(bytearray(n)) if into is None else into
        got = 0
        while got < n and (k := os.preadv(fd, [buf[got:]], at + got)):
            got += k
        if got < n:
            raise ValueError("it ends early")
        return buf

    file_size = os.fstat(fd).st_size
    head = pread(len(MAGIC) + 8, 0)
    if bytes(head[:len(MAGIC)]) != MAGIC:
        raise ValueError("not a memfs search index")
    size = int.from_bytes(head[len(MAGIC):], "little")
    if size > file_size:
        raise ValueError("it ends early")
    header = orjson.loads(pread(size, len(MAGIC) + 8))
    if type(header) is not dict or header.get("format") != FORMAT:
        raise ValueError(f"format {header.get('format') if type(header) is dict else None!r}, not {FORMAT}")
    if header.get("analysis") != label:
        raise ValueError(f"made for {header.get('analysis')!r}, not {label!r}")
    at = len(MAGIC) + 8 + size
    crc = 0
    arrays = {}
    for name, dtype, count in header["arrays"]:
        if dtype not in _DTYPES or type(count) is not int or not 0 <= count <= (file_size - at) // np.dtype(dtype).itemsize:
            raise ValueError(f"its array {name!r} does not fit the file")
        arr = np.empty(count, dtype=np.dtype(dtype))
        data = pread(arr.nbytes, at, memoryview(arr).cast("B"))
        pad = -arr.nbytes % _ALIGN
        crc = zlib.crc32(b"\0" * pad, zlib.crc32(data, crc))
        at += arr.nbytes + pad
        arrays[name] = arr
    if crc != header["crc32"]:
        raise ValueError("its arrays do not match their checksum")
    return header, arrays


def decode(header: dict, arrays: dict[str, Any]) -> tuple[dict, dict[str, Any], int | None]:
    """``(state for SearchIndex.from_snapshot, {name: log key}, the change feed's cursor the
    keys are current at or None)`` from what :func:`_read` read; ValueError when the arrays do
    not match each other."""
    if (any(arrays[n].dtype != np.int32 for n in _INT32) or any(arrays[n].dtype != np.int64 for n in _INT64)
            or any(arrays[n].dtype != np.int8 for n in _INT8) or arrays["slot_created"].dtype != np.float64
            or arrays["key_ino"].dtype != np.uint64):
        raise ValueError("an array of the wrong type")
    tokens = header["tokens"]
    n_docs = len(arrays["doc_len"])
    live, counts = arrays["slot_live"], arrays["slot_n"]
    n_slots = len(live)
    if (any(len(arrays[n]) != n_slots for n in ("slot_source", "slot_created", "slot_total", "name_ends", "sid_ends"))
            or not _within(arrays["slot_source"], len(SOURCES)) or not _within(counts, 2**31)
            or len(arrays["key_name_ends"]) != len(arrays["key_none"])
            or any(len(arrays[n]) != len(arrays["key_none"]) for n in ("key_ino", "key_size", "key_mtime"))):
        raise ValueError("its session columns do not match")
    ends = arrays["token_ends"]
    if (len(ends) != len(tokens) or (len(ends) and ends[-1] != len(arrays["postings"]))
            or not int(counts.sum()) == len(arrays["text_ends"]) == len(arrays["gids"])
            or any(len(arrays[n]) != n_docs for n in ("doc_slot", "doc_local", "doc_turn"))
            or len(arrays["slot_session"]) != n_slots
            or not _within(arrays["gids"], n_docs) or not _within(arrays["postings"][0::2], n_docs)
            or not _within(arrays["doc_slot"], n_slots, -1)
            or not _within(arrays["slot_session"], len(arrays["id_name_ends"]))):
        raise ValueError("its arrays do not match its header")
    text = str(memoryview(arrays.pop("text")), "utf-8", "surrogatepass")
    text_ends, turns, offsets, gids = arrays["text_ends"], arrays["fact_turn"], arrays["fact_offset"], arrays["gids"]
    gid_bytes = gids.tobytes()
    names, sids = _unstrings(arrays["names"], arrays["name_ends"]), _unstrings(arrays["sids"], arrays["sid_ends"])
    restored: list = []
    fact = 0
    for slot, (is_live, created, source, total_len, n) in enumerate(zip(
            live.tolist(), arrays["slot_created"].tolist(), arrays["slot_source"].tolist(),
            arrays["slot_total"].tolist(), counts.tolist())):
        if not is_live:
            restored.append(None)
            continue
        created_at = None if created != created else int(created) if created.is_integer() else created  # (NaN: none)
        restored.append((names[slot], sids[slot], created_at, SOURCES[source], total_len,
                         SavedFacts(text, text_ends, turns, offsets, fact, n), gid_bytes[4 * fact: 4 * (fact + n)]))
        fact += n
    state = {"tokens": tokens, "postings": memoryview(arrays["postings"]).cast("B"), "token_ends": ends,
             "columns": {n: arrays[n] for n in ("doc_len", "doc_slot", "doc_local", "doc_turn", "slot_session")},
             "slots": restored, "session_ids": _unstrings(arrays["id_names"], arrays["id_name_ends"]),
             "live_docs": header["live_docs"],
             "live_len": header["live_len"], "dead_docs": header["dead_docs"]}
    keys = {name: None if none else pack_key(ino, size, mtime) for name, none, ino, size, mtime in zip(
        _unstrings(arrays["key_names"], arrays["key_name_ends"]), arrays["key_none"].tolist(),
        arrays["key_ino"].tolist(), arrays["key_size"].tolist(), arrays["key_mtime"].tolist())}
    cursor = header.get("cursor")
    return state, keys, int(cursor) if type(cursor) is str and cursor.isdigit() and cursor != "0" else None


class SavedFacts(Sequence):
    """One session's facts as the saved file holds them — ``(text, turn, offset)`` each, read
    from the file's arrays when asked for, so loading an index costs its sessions, not its
    facts (the index copies them into a list before it adds to them)."""

    __slots__ = ("_text", "_ends", "_turns", "_offsets", "_first", "_n")

    def __init__(self, text: str, ends: np.ndarray, turns: np.ndarray, offsets: np.ndarray, first: int, n: int):
        self._text, self._ends, self._turns, self._offsets, self._first, self._n = text, ends, turns, offsets, first, n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> tuple: ...

    @overload
    def __getitem__(self, i: slice) -> list: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("fact index out of range")
        k = self._first + i
        turn, offset = int(self._turns[k]), int(self._offsets[k])
        return (self._text[int(self._ends[k - 1]) if k else 0: int(self._ends[k])], None if turn == NONE else turn,
                None if offset == NONE else offset)


def current(root: str | os.PathLike, label: str) -> bool:
    """Whether a saved index ``label`` of this :data:`FORMAT` and analysis is there (its
    header only is read: :func:`load` checks the rest)."""
    try:
        fd = open_nofollow(index_path(root, label), os.O_RDONLY)
    except (OSError, MemfsError):
        return False
    try:
        head = os.pread(fd, len(MAGIC) + 8, 0)
        if not head.startswith(MAGIC) or len(head) < len(MAGIC) + 8:
            return False
        size = int.from_bytes(head[len(MAGIC):], "little")
        header = orjson.loads(os.pread(fd, size, len(MAGIC) + 8))
        return type(header) is dict and header.get("format") == FORMAT and header.get("analysis") == label
    except (OSError, orjson.JSONDecodeError):
        return False
    finally:
        os.close(fd)


def load(root: str | os.PathLike, label: str,
         analyzer: Any = None) -> tuple[SearchIndex, dict[str, Any], int | None] | None:
    """The saved index ``label`` of the store at ``root``, its sessions' log keys and the change
    feed's cursor they are current at (None: unknown), or None when there is none or it cannot
    be used (logged; see the module docstring)."""
    path = index_path(root, label)
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except (OSError, MemfsError) as exc:
        log.warning("search index %s not read (rebuilt from the logs): %s", path, exc)
        return None
    try:
        try:
            header, arrays = _read(fd, label)
        finally:
            os.close(fd)
        state, keys, cursor = decode(header, arrays)
        del arrays  # (what the index keeps is in state; the rest goes before the index is made)
        return SearchIndex.from_snapshot(state, analyzer), keys, cursor
    except (ValueError, KeyError, TypeError, IndexError, OSError, orjson.JSONDecodeError) as exc:
        log.warning("search index %s ignored (rebuilt from the logs): %s", path, exc)
        return None
