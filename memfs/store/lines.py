"""Streaming the complete lines of a log file without loading it."""

from __future__ import annotations

import os
from typing import Iterator

CHUNK = 1 << 20


def scan_lines(fd: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, line)`` for each complete line of ``[start, end)``, ``\\n`` excluded.

    Reads 1 MiB at a time with ``pread``; an unterminated tail is not yielded.
    """
    pos, carry, carry_off = start, b"", start
    while pos < end:
        data = os.pread(fd, min(CHUNK, end - pos), pos)
        if not data:
            break
        pos += len(data)
        lines = (carry + data if carry else data).split(b"\n")
        carry = lines.pop()
        off = carry_off
        for line in lines:
            yield off, line
            off += len(line) + 1
        carry_off = off
