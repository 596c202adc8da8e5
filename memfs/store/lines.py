"""Splitting bytes into complete lines: the one line splitter of the store, in memory
(:func:`split_lines`) and streamed from a file without loading it (:func:`scan_lines`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

from memfs.pace import pace

CHUNK = 1 << 18  # 256 KiB: bigger chunks cost more in page faults than they save in calls


def split_lines(data: bytes) -> tuple[list[bytes], int]:
    """``(lines, cut)``: the complete lines of ``data``, ``\\n`` excluded, and the length
    they span (their ``\\n`` included). ``data[cut:]`` is an unterminated tail (a line still
    being written), for the caller to keep or to read again."""
    lines = data.split(b"\n")
    return lines, len(data) - len(lines.pop())


def scan_chunks(fd: int, start: int, end: int, chunk: int = CHUNK) -> Iterator[tuple[int, list[bytes]]]:
    """Yield ``(offset, lines)`` for the complete lines of ``[start, end)``, ``\\n`` excluded:
    ``offset`` is where the first of ``lines`` starts, each next line starts one byte after
    the previous one ends.

    Reads ``chunk`` bytes at a time with ``pread`` (memory stays bounded by the chunk and the
    longest line); an unterminated tail is not yielded. A batch per chunk rather than a
    generator step per line: the rescan's loop is the hot path of an open. Background work
    gives way to the event loop between chunks (:mod:`memfs.pace`).
    """
    pos, carry, carry_off = start, bytearray(), start
    while pos < end:
        pace()
        data = os.pread(fd, min(chunk, end - pos), pos)
        if not data:
            break
        pos += len(data)
        if b"\n" not in data:  # inside a long line: just collect it
            carry += data
            continue
        if carry:
            carry += data
            data = bytes(carry)
        lines, cut = split_lines(data)
        carry = bytearray(data[cut:])
        yield carry_off, lines
        carry_off = pos - len(carry)


def scan_lines(fd: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, line)`` for each complete line of ``[start, end)``, ``\\n`` excluded.

    An unterminated tail is not yielded.
    """
    for off, lines in scan_chunks(fd, start, end):
        for line in lines:
            yield off, line
            off += len(line) + 1


# --- streamed input of unknown origin: lines bounded by a limit ---------------------------------

KEEP = 4096  # bytes of an over-long line kept for its refusal (memfs.store.rejected keeps as many)


class LongLine:
    """A line over the limit, not held: its first :data:`KEEP` bytes, its length and the
    SHA-256 of all of it (what ``rejected.jsonl`` records of a refused line)."""

    __slots__ = ("head", "size", "_hash")

    def __init__(self, first: bytes | bytearray | memoryview = b""):
        self.head = b""
        self.size = 0
        self._hash = hashlib.sha256()
        if first:
            self.update(first)

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if len(self.head) < KEEP:
            self.head += bytes(data[:KEEP - len(self.head)])
        self.size += len(data)
        self._hash.update(data)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"LongLine({self.size} bytes, {self.head[:32]!r}…)"


class LineSplitter:
    """The one streaming line splitter of input from outside (``memfs import``, ``record``,
    ``append``, a mount's writers): bytes fed in any pieces become complete lines (``\\n``
    excluded), and at most ``limit`` bytes of an unfinished line are ever held. A line over
    ``limit`` is not held: from the byte that crosses the limit to its newline it is only
    counted and hashed, and it comes out as a :class:`LongLine` (refused by the caller with
    its length), after which the next line is read as usual. Memory and time are linear in
    the input whatever the lines' lengths (a line's pieces are not copied again per piece).
    """

    __slots__ = ("limit", "carry", "long")

    def __init__(self, limit: int):
        self.limit = limit
        self.carry = bytearray()  # the unfinished line, while within the limit
        self.long: LongLine | None = None  # the unfinished line, once over it

    @property
    def pending(self) -> int:
        """Bytes of the unfinished line (held or only counted)."""
        return self.long.size if self.long is not None else len(self.carry)

    def _extend(self, data: bytes | memoryview) -> None:
        if self.long is not None:
            self.long.update(data)
        elif len(self.carry) + len(data) > self.limit:
            self.long = LongLine(self.carry)
            self.long.update(data)
            self.carry = bytearray()
        else:
            self.carry += data

    def _end(self, data: bytes | memoryview) -> bytes | LongLine:
        """The unfinished line, completed by ``data`` (its last piece, no ``\\n``)."""
        if self.long is None and len(self.carry) + len(data) <= self.limit:
            line = bytes(self.carry + data) if self.carry else bytes(data)
            self.carry = bytearray()
            return line
        self._extend(data)
        long, self.long = self.long, None
        assert long is not None
        return long

    def feed(self, data: bytes) -> list[bytes | LongLine]:
        """The lines ``data`` completes, in order; its unterminated end is kept (or counted)."""
        last = data.rfind(b"\n")
        if last < 0:
            self._extend(data)
            return []
        view = memoryview(data)
        start = 0
        out: list[bytes | LongLine] = []
        if self.carry or self.long is not None:
            first = data.find(b"\n")
            out.append(self._end(view[:first]))
            start = first + 1
        if start <= last:
            lines = data[start:last].split(b"\n")
            if last - start > self.limit:  # (only then can one of them be over it)
                limit = self.limit
                out.extend(line if len(line) <= limit else LongLine(line) for line in lines)
            else:
                out.extend(lines)
        if last + 1 < len(data):
            self._extend(view[last + 1:])
        return out

    def finish(self) -> bytes | LongLine | None:
        """The unterminated last line, if any (the splitter is then empty)."""
        if self.long is None and not self.carry:
            return None
        return self._end(b"")

    def reset(self) -> None:
        """Drop the unfinished line."""
        self.carry = bytearray()
        self.long = None
