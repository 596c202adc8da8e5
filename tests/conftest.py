"""Fixtures shared by the test modules.

* ``store`` — the path of a sessions root that does not exist yet (``tmp_path/store``);
* ``session`` — a writable handle on a new, empty session ``sess-1`` (no cap, buffered), in
  ``tmp_path``; closed after the test.

The session-store helpers (event lines, reading the store's files directly) are in
``store_helpers.py``; mounting in a subprocess is ``mounting.py``.

``--impl=c|py`` chooses the twin of the store's commit that runs (``memfs/store/writer.py``):
it sets ``MEMFS_IMPL`` before any test imports the store, so the mounts the tests start as
subprocesses run the same one. Default: ``$MEMFS_IMPL`` when set, else ``c``.
``scripts/test.sh`` runs the whole suite with the C twin, then the store tests with ``py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import memfs

SESSION_ID = "sess-1"


def pytest_addoption(parser):
    parser.addoption("--impl", choices=("c", "py"), default=os.environ.get("MEMFS_IMPL") or "c",
                     help="the twin of the store's commit to run: c (memfs/store/_writer.c) or py "
                          "(sets MEMFS_IMPL for this process and the mounts it starts; default: c)")


def pytest_configure(config):
    impl = config.getoption("impl")
    os.environ["MEMFS_IMPL"] = impl
    writer = sys.modules.get("memfs.store.writer")
    if writer is not None and writer.IMPL != impl:  # imported before this hook: too late to choose
        raise pytest.UsageError(f"--impl={impl}, but memfs.store.writer was imported with {writer.IMPL}")


@pytest.fixture
def store(tmp_path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def session(tmp_path):
    with memfs.open_session(tmp_path, SESSION_ID, max_events=0) as handle:
        yield handle
