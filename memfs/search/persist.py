"""The root search index saved in the store, so a restart does not re-read every log (SPEC §14).

One file per saved index, ``<root>/.search-index/<stem>-<stopwords>-<facts|facts+output>.idx``
(a hidden folder: never a session), replaced atomically (:func:`memfs.store.paths.atomic_write`)::

    MAGIC | header length (8 bytes, little endian) | header (JSON) | arrays (each 8-aligned)

The header holds :data:`FORMAT`, the analysis the index was made with, the CRC-32 of the
arrays, their names, dtypes and lengths, the vocabulary's tokens, each session slot (name, id,
``created_at``, source, token total, fact count) and each session's log key when it was
indexed (:func:`memfs.search.changes.log_key`). The arrays are the index's columns
(:meth:`memfs.search.SearchIndex.snapshot`), its postings concatenated, and the facts' texts
(one UTF-8 blob), turns and offsets.

Decisions recorded here:

* A file that cannot be read, of another :data:`FORMAT`, of another analysis, or whose arrays
  do not match their CRC or their counts, is ignored (and logged): the index is rebuilt from
  the logs, and the next save replaces the file. It is a cache: deleting it loses nothing.
* A loaded session is trusted while its log key is the one saved with it; the searcher
  re-reads only the sessions whose key moved, and drops those gone.
"""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from memfs.search.index import SearchIndex
from memfs.store.paths import atomic_write, ensure_private_dir, read_file, write_all

log = logging.getLogger("memfs.search")

FORMAT = 1
MAGIC = b"memfs search index\n"
DIR = ".search-index"
NONE = -(2**63)  # a fact's turn or offset that is null

_INT32 = ("doc_len", "doc_slot", "doc_local", "doc_turn", "slot_session", "postings", "gids")
_INT64 = ("token_ends", "text_ends", "fact_turn", "fact_offset")
_ALIGN = 8


def index_path(root: str | os.PathLike, label: str) -> Path:
    """Where the index ``label`` (``"none-none-facts"``) of the store at ``root`` is saved."""
    return Path(root) / DIR / f"{label}.idx"


def _ints(values: list, what: str) -> np.ndarray:
    if any(v is not None and type(v) is not int for v in values):
        raise ValueError(f"a fact's {what} is not an integer")
    return np.array([NONE if v is None else v for v in values], dtype=np.int64)


def encode(state: dict, label: str, keys: dict[str, Any]) -> list[bytes | memoryview]:
    """The file's bytes (as pieces) for an index ``state`` (:meth:`SearchIndex.snapshot`)."""
    texts: list[str] = []
    turns: list = []
    offsets: list = []
    gids: list[bytes] = []
    slots: list[list | None] = []
    for entry in state["slots"]:
        if entry is None:
            slots.append(None)
            continue
        name, session_id, created_at, source, total_len, (facts, n), gid_bytes = entry
        for text, turn, offset in facts[:n]:
            texts.append(text)
            turns.append(turn)
            offsets.append(offset)
        gids.append(gid_bytes)
        slots.append([name, session_id, created_at, source, total_len, n])
    arrays = dict(state["columns"])
    arrays["postings"] = np.frombuffer(state["postings"], dtype=np.int32)
    arrays["token_ends"] = np.asarray(state["token_ends"], dtype=np.int64)
    arrays["gids"] = np.frombuffer(b"".join(gids), dtype=np.int32)
    arrays["text"] = np.frombuffer("".join(texts).encode("utf-8", "surrogatepass"), dtype=np.uint8)
    arrays["text_ends"] = np.cumsum(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)))
    arrays["fact_turn"] = _ints(turns, "turn")
    arrays["fact_offset"] = _ints(offsets, "offset")
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
                           "tokens": state["tokens"], "slots": slots, "session_ids": state["session_ids"],
                           "live_docs": state["live_docs"], "live_len": state["live_len"],
                           "dead_docs": state["dead_docs"], "keys": keys})
    header += b" " * (-(len(MAGIC) + 8 + len(header)) % _ALIGN)
    return [MAGIC, len(header).to_bytes(8, "little"), header, *body]


def save(root: str | os.PathLike, label: str, state: dict, keys: dict[str, Any]) -> Path:
    """Write the index ``label``'s ``state`` and the sessions' log ``keys`` atomically."""
    path = index_path(root, label)
    pieces = encode(state, label, keys)
    ensure_private_dir(path.parent)

    def write(fd: int) -> None:
        for piece in pieces:
            write_all(fd, piece)

    atomic_write(path, write)
    return path


def _within(values: np.ndarray, end: int, start: int = 0) -> bool:
    """Every value in ``[start, end)`` (an index the arrays use stays inside what it indexes)."""
    return not len(values) or (int(values.min()) >= start and int(values.max()) < end)


def decode(data: bytes, label: str) -> tuple[dict, dict[str, Any]]:
    """``(state for SearchIndex.from_snapshot, {name: log key})`` from a file's bytes;
    ValueError when it is not a whole, current-format file of this analysis."""
    if not data.startswith(MAGIC):
        raise ValueError("not a memfs search index")
    at = len(MAGIC)
    size = int.from_bytes(data[at: at + 8], "little")
    header = orjson.loads(data[at + 8: at + 8 + size])
    if header.get("format") != FORMAT:
        raise ValueError(f"format {header.get('format')!r}, not {FORMAT}")
    if header.get("analysis") != label:
        raise ValueError(f"made for {header.get('analysis')!r}, not {label!r}")
    at += 8 + size
    view = memoryview(data)
    if zlib.crc32(view[at:]) != header["crc32"]:
        raise ValueError("its arrays do not match their checksum")
    arrays = {}
    for name, dtype, count in header["arrays"]:
        arr = np.frombuffer(view, dtype=np.dtype(dtype), count=count, offset=at)
        at += arr.nbytes + (-arr.nbytes % _ALIGN)
        arrays[name] = arr
    if any(arrays[n].dtype != np.int32 for n in _INT32) or any(arrays[n].dtype != np.int64 for n in _INT64):
        raise ValueError("an array of the wrong type")
    slots, tokens = header["slots"], header["tokens"]
    n_docs = len(arrays["doc_len"])
    counts = [0 if s is None else s[5] for s in slots]
    ends = arrays["token_ends"]
    if (len(ends) != len(tokens) or (len(ends) and ends[-1] != len(arrays["postings"]))
            or not sum(counts) == len(arrays["text_ends"]) == len(arrays["gids"])
            or any(len(arrays[n]) != n_docs for n in ("doc_slot", "doc_local", "doc_turn"))
            or len(arrays["slot_session"]) != len(slots)
            or not _within(arrays["gids"], n_docs) or not _within(arrays["postings"][0::2], n_docs)
            or not _within(arrays["doc_slot"], len(slots), -1)
            or not _within(arrays["slot_session"], len(header["session_ids"]))):
        raise ValueError("its arrays do not match its header")
    text = bytes(arrays["text"]).decode("utf-8", "surrogatepass")
    text_ends = arrays["text_ends"].tolist()
    turns = [None if t == NONE else t for t in arrays["fact_turn"].tolist()]
    offsets = [None if o == NONE else o for o in arrays["fact_offset"].tolist()]
    gids = arrays["gids"]
    restored: list = []
    fact, start = 0, 0
    for slot in slots:
        if slot is None:
            restored.append(None)
            continue
        name, session_id, created_at, source, total_len, n = slot
        facts = []
        for i in range(fact, fact + n):
            facts.append((text[start: text_ends[i]], turns[i], offsets[i]))
            start = text_ends[i]
        restored.append((name, session_id, created_at, source, total_len, facts, gids[fact: fact + n].tobytes()))
        fact += n
    state = {"tokens": tokens, "postings": arrays["postings"].tobytes(), "token_ends": ends,
             "columns": {n: arrays[n] for n in ("doc_len", "doc_slot", "doc_local", "doc_turn", "slot_session")},
             "slots": restored, "session_ids": header["session_ids"], "live_docs": header["live_docs"],
             "live_len": header["live_len"], "dead_docs": header["dead_docs"]}
    keys = {name: None if key is None else tuple(key) for name, key in header["keys"].items()}
    return state, keys


def load(root: str | os.PathLike, label: str, analyzer: Any = None) -> tuple[SearchIndex, dict[str, Any]] | None:
    """The saved index ``label`` of the store at ``root`` and its sessions' log keys, or None
    when there is none or it cannot be used (logged; see the module docstring)."""
    path = index_path(root, label)
    try:
        data = read_file(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("search index %s not read (rebuilt from the logs): %s", path, exc)
        return None
    try:
        state, keys = decode(data, label)
        return SearchIndex.from_snapshot(state, analyzer), keys
    except (ValueError, KeyError, TypeError, IndexError, orjson.JSONDecodeError) as exc:
        log.warning("search index %s ignored (rebuilt from the logs): %s", path, exc)
        return None
