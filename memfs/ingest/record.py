"""``memfs record SESSION [--format …] -- CMD …``: run an agent and keep its stream (SPEC §8).

The agent runs as a child with stdin and stderr inherited and stdout on a pipe. Every byte it
writes to stdout is copied to memfs's stdout as soon as it is read, unchanged, so the agent
and whoever reads its output see what they would see without memfs. Separately, a second
thread cuts the copy into lines, translates them (:mod:`memfs.ingest`; ``auto`` by the first
JSON line) and appends them to the session through the store, with ``write`` durability
(each line is in the log when appended). The copying never waits for the store: a slow disk,
a refused line (recorded in ``rejected.jsonl``, with its reason) or a failing append (reported
once on stderr) never slows, blocks or breaks the agent.

Decisions recorded here:

* The session is opened before the agent starts; when it cannot be (another process holds
  it, a bad name), ``record`` says why and exits 1 without running the agent.
* A command that cannot run is said as a shell says it, with a shell's status (127 not found,
  126 found but not executable: :class:`NotRunnable`), and leaves nothing behind: it is looked
  up before the session is opened, and a session (or store) made for a command whose start
  then fails anyway is removed again.
* **A crash mid-turn.** When the agent exits and the session is left inside a turn it was
  recording, ``record`` closes that turn as failed — ``turn.failed`` with the message "agent
  exited with status N before the turn ended" (or "killed by signal SIG…") — so the session
  keeps everything that arrived, shows why the turn ended, and is not left ``in_turn``
  forever.
* The exit status is the agent's; an agent killed by signal N gives 128+N. While the agent
  runs, ``record`` ignores SIGINT (the terminal sends it to the agent too: Ctrl-C stops the
  agent, and ``record`` finishes the recording) and forwards SIGTERM and SIGHUP to it.
* When memfs's own stdout goes away (the reader of a pipe exits), the copying stops and the
  agent's pipe is closed, so the agent sees the broken pipe it would see without memfs.
* A last line without a newline is recorded when the agent exits.
* A line over ``max_line_bytes`` is refused as it streams past, never held
  (:class:`memfs.store.lines.LineSplitter`): its first 4 KiB, length and hash go to
  ``rejected.jsonl``, and the next line is recorded as usual. The copying thread cuts the
  lines (hashing a long line as it passes costs far less than the pipe), so what waits for the
  store is complete lines, never the pieces of a long one.
* **Identity** (SPEC §10, :mod:`memfs.ingest.identity`): what the session already holds of the
  conversation (a resumed run's replay, another capture's turns) is not appended again; the
  record's metadata goes to ``index/about.json`` as it arrives — ``conversation_id`` as soon as
  the stream names it, so that a later ``memfs import`` of the agent's own files finds this
  session whatever its name — and ``agent`` from the command's name (``claude``, ``codex``,
  ``gemini``) when the stream does not say.
"""

from __future__ import annotations

import errno
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from memfs import agents
from memfs.errors import MemfsError
from memfs.ingest import AutoTranslator, dumps, identity
from memfs.ingest.importer import feed_line, reject
from memfs.store.batch import append_tolerant
from memfs.store.catalog import forgotten
from memfs.store.config import DEFAULT_EVICT_TO, DEFAULT_MAX_LINE_BYTES
from memfs.store.lines import LineSplitter
from memfs.store.paths import remove_tree, sanitize
from memfs.store.session import open_session

READ_SIZE = 1 << 16


class RecordReport:
    def __init__(self) -> None:
        self.lines = 0
        self.appended = 0
        self.refused = 0
        self.store_error: str | None = None
        self.closed_turn: str | None = None


class NotRunnable(MemfsError):
    """The agent's command cannot be run; ``status`` is a shell's for it (127 or 126)."""

    def __init__(self, reason: str, status: int):
        super().__init__(reason)
        self.status = status


def check_runnable(program: str) -> None:
    """Raise :class:`NotRunnable` when a shell could not run ``program``: a name not on
    ``PATH`` (127, "command not found"), a path that does not exist (127) or is not an
    executable file (126)."""
    if "/" not in program:
        if shutil.which(program) is None:
            raise NotRunnable(f"{program}: command not found", 127)
        return
    if not os.path.exists(program):
        raise NotRunnable(f"{program}: No such file or directory", 127)
    if os.path.isdir(program):
        raise NotRunnable(f"{program}: Is a directory", 126)
    if not os.access(program, os.X_OK):
        raise NotRunnable(f"{program}: Permission denied", 126)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _exit_reason(status: int) -> str:
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"agent killed by {name} before the turn ended"
    return f"agent exited with status {status} before the turn ended"


def record(root: Path, session: str, cmd: Sequence[str], *, fmt: str = "auto", max_events: int = 0,
           evict_to: float = DEFAULT_EVICT_TO, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
           stdout_fd: int | None = None, warn=None) -> tuple[int, RecordReport]:
    """Run ``cmd``, copy its stdout to ``stdout_fd`` and record its events in ``session``.

    Returns ``(exit status, report)``; the status is the agent's (128+N for signal N).
    Raises :class:`NotRunnable` for a command that cannot run, having created nothing.
    """
    out_fd = sys.stdout.fileno() if stdout_fd is None else stdout_fd
    warn = warn or (lambda text: print(f"memfs record: {text}", file=sys.stderr, flush=True))
    report = RecordReport()
    translator = AutoTranslator(fmt)
    check_runnable(cmd[0])
    root = Path(root)
    new_root, new_session = not os.path.lexists(root), not os.path.lexists(root / sanitize(session))
    handle = open_session(root, session, durability="write", max_events=max_events, evict_to=evict_to,
                          max_line_bytes=max_line_bytes)
    program = os.path.basename(cmd[0])
    capture = identity.Capture(root, agent=agents.by_command(program), live=True)  # (its table's command)
    try:  # the session's writer for the whole run: a busy session is said before the agent starts
        handle.writes.claim_writing(lock=True)
        capture.attach(handle)
    except BaseException:
        handle.close()
        raise
    lines: queue.SimpleQueue = queue.SimpleQueue()

    splitter = LineSplitter(max_line_bytes)  # (fed by the copying: a long line never queues up)

    def store_lines() -> None:
        while True:
            parts = lines.get()
            final = parts is None
            if final:
                parts = [tail] if (tail := splitter.finish()) is not None else []
            batch: list[bytes] = []
            for raw in parts:
                fed = feed_line(translator, raw, max_line_bytes)
                if fed is None:
                    continue
                report.lines += 1
                events, error = fed
                if error is None:
                    batch.extend(events)
                    continue
                _append(batch)
                batch = []
                report.refused += 1
                _guard(lambda raw=raw, error=error: reject(handle, raw, error))
            _append(batch)
            if final:
                _append(capture.finish(), filtered=True)
                return

    def _append(batch: list[bytes], filtered: bool = False) -> None:
        def go():
            kept = batch if filtered else capture.filter(batch, translator.meta)
            if kept:
                a, r = append_tolerant(handle, kept)
                report.appended += a
                report.refused += r
                capture.appended(kept, a)
            capture.after(handle, translator.meta)
        if batch:
            _guard(go)

    def _guard(action) -> None:
        try:
            action()
        except (MemfsError, OSError) as exc:  # the store failed: say so once, keep the agent going
            if report.store_error is None:
                report.store_error = str(exc)
                warn(f"cannot append to {handle.name}: {exc} (the agent goes on; later failures are not repeated)")

    in_turn_before = handle.manifest["in_turn"]
    appended_before = handle.manifest["event_count"]
    storer = threading.Thread(target=store_lines, name="memfs-record-store", daemon=True)
    try:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, bufsize=0)
    except OSError as exc:  # found, but it would not start (a race, no interpreter for it)
        handle.writes.end_writing()
        handle.close()
        if new_session:  # nothing was recorded: leave nothing behind
            remove_tree(root / sanitize(session))
            forgotten(root, sanitize(session))  # (the catalog of a store left empty goes too)
            if new_root:
                os.rmdir(root)
        raise NotRunnable(f"{cmd[0]}: {exc.strerror}", 127 if exc.errno == errno.ENOENT else 126) from None
    forwarded = {}

    def forward(signum, frame):
        if proc.poll() is None:
            proc.send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGHUP):
        forwarded[s] = signal.signal(s, forward)
    forwarded[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    storer.start()
    try:
        pipe = proc.stdout.fileno()
        passing = True
        while True:
            try:
                chunk = os.read(pipe, READ_SIZE)
            except InterruptedError:
                continue
            if not chunk:
                break
            if passing:
                try:
                    _write_all(out_fd, chunk)
                except BrokenPipeError:
                    passing = False
                    lines.put(splitter.feed(chunk))
                    proc.stdout.close()  # the agent now meets the broken pipe it would have met
                    break
            lines.put(splitter.feed(chunk))
        status = proc.wait()
    finally:
        lines.put(None)
        storer.join()
        for s, handler in forwarded.items():
            signal.signal(s, handler)
        try:
            if report.appended and handle.manifest["in_turn"] and \
                    (handle.manifest["event_count"] > appended_before or not in_turn_before):
                reason = _exit_reason(proc.returncode if proc.returncode is not None else -9)
                _guard(lambda: handle.append(dumps({"type": "turn.failed", "message": reason})))
                report.closed_turn = reason
        finally:
            handle.writes.end_writing()
            handle.close()
    return (128 - status if status < 0 else status), report
