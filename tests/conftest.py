"""Fixtures shared by the test modules.

* ``store`` — the path of a sessions root that does not exist yet (``tmp_path/store``);
* ``session`` — a writable handle on a new, empty session ``sess-1`` (no cap, buffered), in
  ``tmp_path``; closed after the test.

The session-store helpers (event lines, reading the store's files directly) are in
``store_helpers.py``; mounting in a subprocess is ``mounting.py``.
"""

from __future__ import annotations

from pathlib import Path

import memfs
import pytest

SESSION_ID = "sess-1"


@pytest.fixture
def store(tmp_path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def session(tmp_path):
    with memfs.open_session(tmp_path, SESSION_ID, max_events=0) as handle:
        yield handle
