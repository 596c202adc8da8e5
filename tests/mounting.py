"""Real mounts for the tests: ``memfs mount`` in a subprocess, always unmounted afterwards."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from memfs.fs.registry import is_mounted  # noqa: F401 (the tests' name for it)

HAVE_FUSE = os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None
needs_fuse = pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3")




class Mount:
    """A running ``memfs mount``: its process, mountpoint, store and log file."""

    def __init__(self, proc: subprocess.Popen, mnt: Path, store: Path, log: Path):
        self.proc, self.mnt, self.store, self.log = proc, mnt, store, log

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        """Signal the server and wait for it to exit (and the mount to go)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        deadline = time.monotonic() + 5
        while is_mounted(self.mnt) and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def start(store: Path, mnt: Path, *args: str, env: dict | None = None, timeout: float = 15,
          wrap: tuple[str, ...] = ()) -> Mount:
    """Start ``python -m memfs mount STORE MNT ARGS`` and wait until the mount is up; ``wrap``:
    a command that runs it (``("unshare", "--pid", "--fork")``: the server is then not
    :attr:`Mount.proc` but its child)."""
    mnt.mkdir(parents=True, exist_ok=True)
    log = mnt.parent / f"{mnt.name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*wrap, sys.executable, "-m", "memfs", "mount", str(store), str(mnt), *args],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, env={**os.environ, **(env or {})},
        )
    m = Mount(proc, mnt, store, log)
    deadline = time.monotonic() + timeout
    while not is_mounted(mnt):
        if proc.poll() is not None or time.monotonic() > deadline:
            cleanup(m)
            raise RuntimeError(f"memfs mount did not come up:\n{m.log_text()}")
        time.sleep(0.02)
    return m


def cleanup(m: Mount) -> None:
    """Stop the server; whatever happens, leave nothing mounted."""
    try:
        m.stop()
    finally:
        if is_mounted(m.mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(m.mnt)], check=False)
        if m.proc.poll() is None:
            m.proc.kill()
            m.proc.wait(5)


@contextmanager
def mounted(store: Path, mnt: Path, *args: str, env: dict | None = None, wrap: tuple[str, ...] = ()):
    m = start(store, mnt, *args, env=env, wrap=wrap)
    try:
        yield m
    finally:
        cleanup(m)


def sh(cmd: str, cwd: Path, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a shell command as a user would; stdout/stderr captured as text."""
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True,
                          check=check, timeout=timeout)


def event(etype: str, **fields) -> str:
    import json

    return json.dumps({"schema_version": "0.18.0", "event": {"type": etype, **fields}}, separators=(",", ":"))


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read()
    except FileNotFoundError:
        return False


def children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` now (from /proc)."""
    found = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if entry.isdigit() and int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.add(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return found
