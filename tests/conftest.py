"""Fixtures shared by the test modules.

* ``store`` — the path of a sessions root that does not exist yet (``tmp_path/store``);
* ``session`` — a writable handle on a new, empty session ``sess-1`` (no cap, buffered), in
  ``tmp_path``; closed after the test.

The session-store helpers (event lines, reading the store's files directly) are in
``store_helpers.py``; mounting in a subprocess is ``mounting.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import memfs
import pytest

SESSION_ID = "sess-1"


@pytest.fixture(autouse=True, scope="session")
def _no_user_config(tmp_path_factory):
    """Every command reads ``$XDG_CONFIG_HOME/memfs/config.toml`` when ``--config`` is not given:
    the tests (and the commands they start) see an empty config home, never the user's."""
    before = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("xdg-config"))
    yield
    if before is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = before


@pytest.fixture
def store(tmp_path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def session(tmp_path):
    with memfs.open_session(tmp_path, SESSION_ID, max_events=0) as handle:
        yield handle


@pytest.fixture
def follower():
    """Start ``memfs import --follow --store STORE DIRS…``; every one started is killed by pid at
    the end, whatever happened."""
    procs: list[subprocess.Popen] = []

    def start(store: Path, *dirs: Path) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-m", "memfs", "import", "--follow", "--store", str(store), *map(str, dirs)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)
