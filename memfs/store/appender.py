"""A byte stream to validated appends: the write semantics of ``events.jsonl`` (SPEC §6).

One :class:`LineAppender` per writer (an open file handle of the filesystem, or the CLI's
input). A write may carry several lines and may end mid-line: the fragment is kept until its
``\\n`` arrives, so lines from two writers never interleave. Each complete line is validated;
the valid lines before the first invalid one are committed and the write reports only their
bytes (a short write). The caller's retry of the remainder then starts with the bad line,
which is refused (recorded in ``rejected.jsonl`` once, when the refusal is reported) — so
``cat`` and ``tee`` report "Bad message".
"""

from __future__ import annotations

from memfs.errors import LineTooLong, ValidationError
from memfs.store.log import SessionHandle


class LineAppender:
    """Splits written bytes into lines and appends them to ``handle``."""

    def __init__(self, handle: SessionHandle, *, max_line_bytes: int, pid: int | None = None):
        self.handle = handle
        self.max_line_bytes = max_line_bytes
        self.pid = pid
        self.partial = bytearray()  # an unterminated line: earlier writes' bytes

    def write(self, data: bytes) -> int:
        """Append the complete lines of ``partial + data``; return how many bytes of ``data``
        were taken (all of them unless a line was refused).

        Raises the :class:`ValidationError` when the first line it would commit is refused;
        that line (with the fragment before it) is recorded and dropped.
        """
        buf = bytes(self.partial) + data if self.partial else data
        carried = len(self.partial)
        last_nl = buf.rfind(b"\n")
        if last_nl < 0:
            if len(buf) > self.max_line_bytes:
                self.partial = bytearray()
                self._refuse(buf, LineTooLong(
                    f"line is over the limit of {self.max_line_bytes} bytes (max_line_bytes)"))
            self.partial = bytearray(buf)
            return len(data)

        records, taken = [], 0
        for line in buf[:last_nl].split(b"\n"):
            try:
                records.append(self.handle.validate(line))
            except ValidationError as exc:
                if records:
                    break  # a short write: the retry will report this line
                self.partial = bytearray()
                self._refuse(line, exc)
            taken += len(line) + 1
        else:
            self.handle.append_records(records)
            if len(buf) - last_nl - 1 > self.max_line_bytes:
                self.partial = bytearray()  # short write: the retry reports the long line
                return last_nl + 1 - carried
            self.partial = bytearray(buf[last_nl + 1 :])
            return len(data)
        self.partial = bytearray()
        self.handle.append_records(records)
        return taken - carried

    def close(self) -> None:
        """Validate a pending fragment as the final line; raise if it is refused."""
        if not self.partial:
            return
        fragment, self.partial = bytes(self.partial), bytearray()
        try:
            record = self.handle.validate(fragment)
        except ValidationError as exc:
            self._refuse(fragment, exc)
        self.handle.append_records([record])

    def _refuse(self, line: bytes, error: ValidationError) -> None:
        self.handle.reject(line, error, pid=self.pid)
        raise error
