"""The root search index saved in the store, so a restart does not re-read every log (SPEC §14).

One file per saved index, ``<root>/.search-index/<stem>-<stopwords>-<facts|facts+output>.idx``
(a hidden folder: never a session), replaced atomically (:func:`memfs.store.paths.atomic_write`)::

    MAGIC (zero-padded to 8 bytes) | arrays (each 8-aligned) | header (JSON) | header length (8 bytes, little endian)

The header holds :data:`FORMAT`, the analysis the index was made with, the CRC-32 of the
arrays, their names, dtypes and lengths, and the vocabulary's tokens. The arrays are the index's
columns (:meth:`memfs.search.SearchIndex.snapshot`), its postings concatenated, the facts'
texts (one UTF-8 blob, each text's end in bytes), turns and offsets, each session slot's name,
id, ``created_at``, source, token total and fact count, and each session's log key when it was indexed
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
* A save writes each array as it makes it, the header last: it holds one piece of one array
  at a time (:data:`_CHUNK` facts or strings, or one token's postings), never the file. A
  loaded session's facts are sliced from the arrays they were read from, not made into
  objects again; the snapshot it writes references what only grows (postings, facts, gids)
  with its lengths at that moment rather than copying it.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import zlib
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import orjson

from memfs.errors import MemfsError
from memfs.search.index import SOURCES, SearchIndex
from memfs.search.numpy_once import np
from memfs.store.catalog import pack_key, unpack_key
from memfs.store.paths import atomic_write, ensure_private_dir, open_nofollow, write_all

log = logging.getLogger("memfs.search")

FORMAT = 4
MAGIC = b"memfs search index\n"
DIR = ".search-index"
NONE = -(2**63)  # a fact's turn or offset that is null

_INT32 = ("doc_len", "doc_slot", "doc_local", "doc_turn", "slot_session", "postings", "gids")
_INT64 = ("token_ends", "text_ends", "fact_turn", "fact_offset", "slot_total", "slot_n", "key_size", "key_mtime",
          "name_ends", "sid_ends", "key_name_ends", "id_name_ends")
_INT8 = ("slot_live", "slot_source", "key_none")
_ALIGN = 8
_START = len(MAGIC) + -len(MAGIC) % _ALIGN  # where the arrays begin
_CHUNK = 16384  # facts or strings made into bytes at a time
_FLUSH = 1 << 20  # bytes gathered before a write


def index_path(root: str | os.PathLike, label: str) -> Path:
    """Where the index ``label`` (``"none-none-facts"``) of the store at ``root`` is saved."""
    return Path(root) / DIR / f"{label}.idx"


def _ints(values: list, what: str) -> np.ndarray:
    if any(v is not None and type(v) is not int for v in values):
        raise ValueError(f"a fact's {what} is not an integer")
    return np.array([NONE if v is None else v for v in values], dtype=np.int64)


def _unstrings(blob: np.ndarray, ends: np.ndarray) -> list[str]:
    """Strings written by :meth:`_Writer.strings`, each interned (one str per session name in the process)."""
    text = str(memoryview(blob), "utf-8", "surrogatepass")
    bounds = [0, *ends.tolist()]
    if bounds[-1] != len(text):
        raise ValueError("its strings do not match their ends")
    intern = sys.intern
    return [intern(text[bounds[i]: bounds[i + 1]]) for i in range(len(ends))]


class _Writer:
    """An index file written as its arrays are made: each array's pieces go to the file (in
    writes of about :data:`_FLUSH` bytes) and are dropped, so a save holds one piece at a time,
    not the file. The header, which lists the arrays and their CRC-32, comes last."""

    def __init__(self, fd: int) -> None:
        self.fd, self.crc, self.size = fd, 0, 0
        self.listed: list[list] = []
        self.pending: list[bytes | memoryview] = [MAGIC + b"\0" * (_START - len(MAGIC))]

    def _put(self, data: memoryview) -> None:
        self.crc = zlib.crc32(data, self.crc)
        if len(data) >= _FLUSH:
            self.flush()
            write_all(self.fd, data)
            return
        self.pending.append(data)
        self.size += len(data)
        if self.size >= _FLUSH:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            write_all(self.fd, b"".join(self.pending))
            self.pending, self.size = [], 0

    def array(self, name: str, dtype: Any, pieces: Iterable) -> None:
        """The array ``name`` of ``dtype``, made of ``pieces`` (numpy arrays, or buffers of that dtype's items)."""
        dtype = np.dtype(dtype)
        nbytes = 0
        for piece in pieces:
            if isinstance(piece, np.ndarray):
                piece = np.ascontiguousarray(piece, dtype=dtype)
            data = memoryview(piece).cast("B")
            nbytes += len(data)
            self._put(data)
        if nbytes % dtype.itemsize:
            raise ValueError(f"its array {name!r} is not a whole number of items")
        if nbytes % _ALIGN:
            self._put(memoryview(b"\0" * (-nbytes % _ALIGN)))
        self.listed.append([name, dtype.str, nbytes // dtype.itemsize])

    def strings(self, name: str, ends_name: str, values: Sequence[str]) -> None:
        """``values`` as one UTF-8 array ``name`` and their ends (in characters of the decoded
        blob) ``ends_name``, written :data:`_CHUNK` strings at a time."""
        ends = np.empty(len(values), dtype=np.int64)

        def pieces() -> Iterator[bytes]:
            chars = 0
            for start in range(0, len(values), _CHUNK):
                part = values[start: start + _CHUNK]
                lengths = np.fromiter(map(len, part), dtype=np.int64, count=len(part))
                ends[start: start + len(part)] = chars + np.cumsum(lengths)
                text = "".join(part)
                chars += len(text)
                yield text.encode("utf-8", "surrogatepass")

        self.array(name, np.uint8, pieces())
        self.array(ends_name, np.int64, [ends])

    def finish(self, header: dict) -> None:
        """The header (with the arrays' list and CRC-32), then its length, and every byte written."""
        data = orjson.dumps({**header, "crc32": self.crc, "arrays": self.listed})
        self.pending += [data, len(data).to_bytes(8, "little")]
        self.flush()


def _saved_chunks(facts: SavedFacts, first: int, end: int) -> Iterator[tuple]:
    """The facts ``first``..``end`` of a loaded file's arrays as :func:`_fact_chunks`' chunks."""
    ends = facts._ends
    for start in range(first, end, _CHUNK):
        stop = min(start + _CHUNK, end)
        at = int(ends[start - 1]) if start else 0
        yield (facts._text[at: int(ends[stop - 1])], ends[start: stop] - at, facts._turns[start: stop],
               facts._offsets[start: stop])


def _tuple_chunk(facts: list[tuple]) -> tuple:
    """``(text, turn, offset)`` facts as one of :func:`_fact_chunks`' chunks."""
    texts = [f[0].encode("utf-8", "surrogatepass") for f in facts]
    ends = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
    return b"".join(texts), ends, _ints([f[1] for f in facts], "turn"), _ints([f[2] for f in facts], "offset")


def _fact_chunks(slot_facts: list, counts: list[int]) -> Iterator[tuple]:
    """Every live slot's first ``count`` facts, in slot order, as chunks ``(their texts joined
    in UTF-8, each one's end in it, turns, offsets)`` of about :data:`_CHUNK` facts. The facts of
    sessions loaded from one file and not changed since (:class:`SavedFacts`) are sliced from
    its arrays, consecutive ones as one run — no object per fact; other sessions' from their tuples."""
    run: tuple | None = None  # (SavedFacts of the run's arrays, first fact, end)
    waiting: list[tuple] = []
    for facts, n in zip(slot_facts, counts):
        if facts is None or not n:
            continue
        if isinstance(facts, SavedFacts):
            if waiting:
                yield _tuple_chunk(waiting)
                waiting = []
            if run is not None and run[0]._ends is facts._ends and run[2] == facts._first:
                run = (run[0], run[1], facts._first + n)
                continue
            if run is not None:
                yield from _saved_chunks(*run)
            run = (facts, facts._first, facts._first + n)
            continue
        if run is not None:
            yield from _saved_chunks(*run)
            run = None
        waiting.extend(itertools.islice(facts, n))
        if len(waiting) >= _CHUNK:
            yield _tuple_chunk(waiting)
            waiting = []
    if run is not None:
        yield from _saved_chunks(*run)
    if waiting:
        yield _tuple_chunk(waiting)


def _write_facts(out: _Writer, slot_facts: list, counts: list[int]) -> None:
    """The facts' texts in UTF-8 (streamed), then their ends in it, turns and offsets (filled meanwhile)."""
    total = sum(counts)
    ends, turns, offsets = (np.empty(total, dtype=np.int64) for _ in range(3))

    def texts() -> Iterator[bytes]:
        at = size = 0
        for text, text_ends, chunk_turns, chunk_offsets in _fact_chunks(slot_facts, counts):
            stop = at + len(text_ends)
            ends[at: stop], turns[at: stop], offsets[at: stop] = text_ends + size, chunk_turns, chunk_offsets
            at, size = stop, size + len(text)
            yield text

    out.array("text", np.uint8, texts())
    for name, column in (("text_ends", ends), ("fact_turn", turns), ("fact_offset", offsets)):
        out.array(name, np.int64, [column])


def _write_keys(out: _Writer, keys: Mapping[str, Any]) -> None:
    """The sessions' names and log keys, a column per part of the key."""
    names, values = list(keys), list(keys.values())
    out.strings("key_names", "key_name_ends", names)
    out.array("key_none", np.int8, [np.fromiter((k is None for k in values), dtype=np.int8, count=len(values))])
    for i, (column, dtype) in enumerate((("key_ino", np.uint64), ("key_size", np.int64), ("key_mtime", np.int64))):
        out.array(column, dtype, [np.fromiter((0 if k is None else unpack_key(k)[i] for k in values), dtype=dtype,
                                              count=len(values))])  # (an inode number may pass 2**63)


def write(fd: int, state: dict, label: str, keys: Mapping[str, Any], cursor: int | None = None) -> None:
    """Write the index file for ``state`` (:meth:`SearchIndex.snapshot`) to ``fd``."""
    out = _Writer(fd)
    for name, column in state["columns"].items():
        out.array(name, np.int32, [column])
    postings = state["postings"]
    out.array("postings", np.int32, (p[:n] for p, n in postings))  # (a copy of what was there at the snapshot)
    out.array("token_ends", np.int64, [np.cumsum(np.fromiter((n for _, n in postings), dtype=np.int64,
                                                                count=len(postings)))])
    slots = state["slots"]
    counts = slots["n"].tolist()
    out.array("gids", np.int32, _gid_pieces(slots["gids"], counts))
    _write_facts(out, slots["facts"], counts)
    for name, column in (("slot_live", "live"), ("slot_source", "source"), ("slot_created", "created"),
                         ("slot_total", "total"), ("slot_n", "n")):
        out.array(name, slots[column].dtype, [slots[column]])
    out.strings("names", "name_ends", slots["names"])
    out.strings("sids", "sid_ends", slots["sids"])
    out.strings("id_names", "id_name_ends", state["session_ids"])
    _write_keys(out, keys)
    out.finish({"format": FORMAT, "analysis": label, "tokens": state["tokens"], "live_docs": state["live_docs"],
                "live_len": state["live_len"], "dead_docs": state["dead_docs"],
                "cursor": str(cursor) if cursor is not None else None})  # (past 64 bits: text)


def _gid_pieces(slot_gids: list, counts: list[int]) -> Iterator[array]:
    """Each live slot's first ``count`` gids, :data:`_CHUNK` or so at a time."""
    part = array("i")
    for gids, n in zip(slot_gids, counts):
        if gids is not None:
            part += gids[:n]
            if len(part) >= _CHUNK:
                yield part
                part = array("i")
    yield part


def save(root: str | os.PathLike, label: str, state: dict, keys: Mapping[str, Any], cursor: int | None = None) -> Path:
    """Write the index ``label``'s ``state`` and the sessions' log ``keys`` atomically;
    ``cursor``: the store catalog's change feed's cursor (:meth:`memfs.store.catalog.Catalog.changes_since`)
    up to which every change is in ``keys``, when there is one."""
    path = index_path(root, label)
    ensure_private_dir(path.parent)
    atomic_write(path, lambda fd: write(fd, state, label, keys, cursor))
    return path


def _within(values: np.ndarray, end: int, start: int = 0) -> bool:
    """Every value in ``[start, end)`` (an index the arrays use stays inside what it indexes)."""
    return not len(values) or (int(values.min()) >= start and int(values.max()) < end)


_DTYPES = frozenset(("<i4", "<i8", "<u8", "|i1", "|u1", "<f8"))  # what encode writes (little-endian)


def _read(fd: int, label: str) -> tuple[dict, dict[str, Any]]:
    """The header and the arrays of an open index file, each array read into memory of its own
    (no buffer of the whole file held meanwhile); ValueError when it is not a whole,
    current-format file of this analysis."""
    header, header_at = _header(fd)
    if header.get("analysis") != label:
        raise ValueError(f"made for {header.get('analysis')!r}, not {label!r}")
    at = _START
    crc = 0
    arrays = {}
    for name, dtype, count in header["arrays"]:
        if dtype not in _DTYPES or type(count) is not int or not 0 <= count <= (header_at - at) // np.dtype(dtype).itemsize:
            raise ValueError(f"its array {name!r} does not fit the file")
        arr = np.empty(count, dtype=np.dtype(dtype))
        data = _pread(fd, arr.nbytes, at, memoryview(arr).cast("B"))
        pad = -arr.nbytes % _ALIGN
        crc = zlib.crc32(b"\0" * pad, zlib.crc32(data, crc))
        at += arr.nbytes + pad
        arrays[name] = arr
    if crc != header["crc32"]:
        raise ValueError("its arrays do not match their checksum")
    return header, arrays


def _pread(fd: int, n: int, at: int, into: memoryview | None = None) -> memoryview:
    """``n`` bytes of ``fd`` at ``at`` (into ``into`` when given); ValueError when there are fewer."""
    buf = memoryview(bytearray(n)) if into is None else into
    got = 0
    while got < n and (k := os.preadv(fd, [buf[got:]], at + got)):
        got += k
    if got < n:
        raise ValueError("it ends early")
    return buf


def _header(fd: int) -> tuple[dict, int]:
    """The header of an open index file of this :data:`FORMAT` and where it starts; ValueError
    when there is none."""
    file_size = os.fstat(fd).st_size
    if file_size < _START + 8 or bytes(_pread(fd, len(MAGIC), 0)) != MAGIC:
        raise ValueError("not a memfs search index")
    size = int.from_bytes(_pread(fd, 8, file_size - 8), "little")
    if size > file_size - 8 - _START:
        raise ValueError("it ends early")
    header = orjson.loads(_pread(fd, size, file_size - 8 - size))
    if type(header) is not dict or header.get("format") != FORMAT:
        raise ValueError(f"format {header.get('format') if type(header) is dict else None!r}, not {FORMAT}")
    return header, file_size - 8 - size


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
    text, text_ends = arrays.pop("text"), arrays["text_ends"]
    _check_texts(text, text_ends)
    turns, offsets, gids = arrays["fact_turn"], arrays["fact_offset"], arrays["gids"]
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


def _check_texts(blob: np.ndarray, ends: np.ndarray) -> None:
    """ValueError unless the facts' ``ends`` cut the UTF-8 ``blob`` into whole texts: so a fact
    read later (:class:`SavedFacts`) always decodes."""
    if len(ends) and (ends[-1] != len(blob) or int(ends[0]) < 0 or bool((np.diff(ends) < 0).any())):
        raise ValueError("its texts do not match their ends")
    cuts = ends[:-1][ends[:-1] < len(blob)]
    if bool(((blob[cuts] & 0xC0) == 0x80).any()):
        raise ValueError("a text's end cuts a character")
    for start in range(0, len(ends), _CHUNK):  # (valid UTF-8, a chunk at a time)
        str(memoryview(blob[int(ends[start - 1]) if start else 0: int(ends[min(start + _CHUNK, len(ends)) - 1])]),
            "utf-8", "surrogatepass")


class SavedFacts(Sequence):
    """One session's facts as the saved file holds them — ``(text, turn, offset)`` each, read
    from the file's arrays when asked for (the texts stay UTF-8 until then: one wide character
    would make a str of them all two or four bytes a character), so loading an index costs its
    sessions, not its facts (the index copies them into a list before it adds to them)."""

    __slots__ = ("_text", "_ends", "_turns", "_offsets", "_first", "_n")

    def __init__(self, text: np.ndarray, ends: np.ndarray, turns: np.ndarray, offsets: np.ndarray, first: int, n: int):
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
        text = str(memoryview(self._text[int(self._ends[k - 1]) if k else 0: int(self._ends[k])]), "utf-8", "surrogatepass")
        return text, None if turn == NONE else turn, None if offset == NONE else offset


def current(root: str | os.PathLike, label: str) -> bool:
    """Whether a saved index ``label`` of this :data:`FORMAT` and analysis is there (its
    header only is read: :func:`load` checks the rest)."""
    try:
        fd = open_nofollow(index_path(root, label), os.O_RDONLY)
    except (OSError, MemfsError):
        return False
    try:
        return _header(fd)[0].get("analysis") == label
    except (OSError, ValueError):
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
