"""Splitting bytes into complete lines: the one line splitter of the store, in memory
(:func:`split_lines`) and streamed from a file without loading it (:func:`scan_lines`)."""

from __future__ import annotations

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
