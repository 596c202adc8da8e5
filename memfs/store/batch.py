"""Appending many lines to a session without a mount, refusals included.

The store records each refused line in ``rejected.jsonl``; these functions say which lines
were refused and go on past them, or stop at the first when asked. Used by ``memfs append``
(a stream: a file or stdin) and by the importers (batches of translated lines).
"""

from __future__ import annotations

import os
import select
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

from memfs.errors import CapRewriteError, ValidationError
from memfs.store.config import DEFAULT_MAX_LINE_BYTES, line_too_long
from memfs.store.lines import LineSplitter, LongLine
from memfs.store.session import SessionHandle


@dataclass
class Appended:
    """What an append of many lines did.

    ``accepted``: the lines appended. ``refused``: ``(line number, reason)`` of each refused
    line, numbered from 1. ``stopped_at``: the line where it stopped early, if it did — the
    refused line, or after a failed cap rewrite (``cap_error``; the lines are committed) the
    last line appended.
    """

    accepted: int = 0
    refused: list[tuple[int, str]] = field(default_factory=list)
    stopped_at: int | None = None
    cap_error: CapRewriteError | None = None


def append_batch(handle: SessionHandle, lines: list[bytes], *, keep_going: bool = True,
                 stop_at_cap: bool = False) -> Appended:
    """Append ``lines`` in order, going on past refused ones (or, without ``keep_going``,
    stopping at the first). A failed cap rewrite (its lines are committed; the cap is retried
    after the next append) stops it when ``stop_at_cap``, else it goes on."""
    result = Appended()
    done = 0  # lines appended or refused
    while done < len(lines):
        try:
            result.accepted += handle.append_many(lines[done:] if done else lines)
            break
        except ValidationError as exc:  # (recorded in rejected.jsonl)
            result.accepted += exc.accepted
            done += exc.accepted + 1
            result.refused.append((done, str(exc)))
            if not keep_going:
                result.stopped_at = done
                break
        except CapRewriteError as exc:
            result.accepted += exc.accepted
            done += exc.accepted
            if stop_at_cap:
                result.stopped_at, result.cap_error = done, exc
                break
            if not exc.accepted:
                done += 1
    return result


def append_tolerant(handle: SessionHandle, lines: list[bytes]) -> tuple[int, int]:
    """Append ``lines`` in order, going on past refused ones and failed cap rewrites.
    Returns ``(accepted, refused)``."""
    result = append_batch(handle, lines)
    return result.accepted, len(result.refused)


def append_stream(handle: SessionHandle, source: IO[bytes], *, keep_going: bool = False,
                  max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Appended:
    """Append the lines of ``source`` as they can be read (:func:`line_batches`), numbering
    them from its first line; stop at the first refused one unless ``keep_going``, and at a
    failed cap rewrite. A line over ``max_line_bytes`` is refused as it streams past, never
    held (:class:`memfs.store.lines.LineSplitter`)."""
    total = Appended()
    lineno = 0  # lines of the input before the batch
    for batch in line_batches(source, max_line=max_line_bytes):
        got = Appended()
        done = 0
        while done < len(batch):  # the plain lines up to the next long one, then that one
            end = next((i for i in range(done, len(batch)) if type(batch[i]) is LongLine), len(batch))
            part = append_batch(handle, batch[done:end], keep_going=keep_going,  # type: ignore[arg-type]
                                stop_at_cap=True)
            got.accepted += part.accepted
            got.refused += [(done + n, reason) for n, reason in part.refused]
            if part.stopped_at is not None:
                got.stopped_at, got.cap_error = done + part.stopped_at, part.cap_error
                break
            if end < len(batch):
                long = batch[end]
                assert isinstance(long, LongLine)
                error = line_too_long(long.size, max_line_bytes)
                handle.writes.reject(long, error)
                got.refused.append((end + 1, str(error)))
                if not keep_going:
                    got.stopped_at = end + 1
                    break
            done = end + 1
        total.accepted += got.accepted
        total.refused += [(lineno + n, reason) for n, reason in got.refused]
        if got.stopped_at is not None:
            total.stopped_at, total.cap_error = lineno + got.stopped_at, got.cap_error
            break
        lineno += len(batch)
    return total


def line_batches(source: IO[bytes], limit: int = 16 << 20,
                 max_line: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[list[bytes | LongLine]]:
    """The lines of ``source`` (without their newline; a line over ``max_line`` as a
    :class:`LongLine`, not held), in batches of what can be read now, up to about ``limit``
    bytes: a file is taken in large batches (one ``append_many`` each: a cap crossed several
    times in one batch rewrites the log once, see :class:`memfs.store.evict.Eviction`), while a
    pipe's lines are appended as soon as they arrive (a batch never waits for more input)."""
    try:
        fd = source.fileno()
    except (AttributeError, OSError, ValueError):  # not a file descriptor (a test's BytesIO)
        fd = -1
    splitter = LineSplitter(max_line)
    eof = False
    while not eof:
        lines: list[bytes | LongLine] = []
        size = 0
        while True:
            chunk = os.read(fd, min(limit - size, 1 << 20)) if fd >= 0 else source.read(min(limit - size, 1 << 20))
            if not chunk:
                eof = True
                break
            lines += splitter.feed(chunk)
            size += len(chunk)
            if size >= limit or (fd >= 0 and not select.select([fd], [], [], 0)[0]):
                break
        if eof and (tail := splitter.finish()) is not None:
            lines.append(tail)  # a last line without its newline
        if lines:
            yield lines
