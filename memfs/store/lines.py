"""Streaming the complete lines of a log file without loading it."""

from __future__ import annotations

import os
from typing import Iterator

from memfs.pace import pace

CHUNK = 1 << 18  # 256 KiB: bigger chunks cost more in page faults than they save in calls


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
        nl = data.rfind(b"\n")
        if nl < 0:  # inside a long line: just collect it
            carry += data
            continue
        if carry:
            carry += data[: nl + 1]
            lines = bytes(carry).split(b"\n")
        else:
            lines = data[: nl + 1].split(b"\n") if nl + 1 < len(data) else data.split(b"\n")
        lines.pop()  # the empty piece after the last \n
        carry = bytearray(data[nl + 1 :])
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
