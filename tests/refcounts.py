"""For the tests of memfs's C modules, which count their references by hand."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Callable


def bytes_kept(churn: Callable[[], None]) -> int:
    """Bytes still allocated after a second run of ``churn`` (the first warms caches: interned
    strings, exception machinery). A missing ``Py_DECREF`` in a loop shows up here."""
    churn()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        churn()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
