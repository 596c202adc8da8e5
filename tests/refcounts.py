"""For the tests of memfs's C modules, which count their references by hand."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Callable, Iterable


def bytes_kept(churn: Callable[[], None], ignore: Iterable[str] = ()) -> int:
    """Bytes still allocated after a second run of ``churn`` (the first warms caches: interned
    strings, exception machinery). A missing ``Py_DECREF`` in a loop shows up here.

    ``ignore``: files whose allocations (anywhere in the allocating call stack) do not count —
    e.g. ``pathlib``, which interns every path component it parses, so the churn of temp-file
    names of atomic writes grows the interpreter's table of interned strings now and then.
    """
    ignore = list(ignore)
    churn()
    gc.collect()
    tracemalloc.start(8 if ignore else 1)  # the ignored files are near the allocation
    try:
        if not ignore:
            before = tracemalloc.get_traced_memory()[0]
            churn()
            gc.collect()
            return tracemalloc.get_traced_memory()[0] - before
        filters = [tracemalloc.Filter(False, name, all_frames=True) for name in ignore]
        first = tracemalloc.take_snapshot().filter_traces(filters)
        churn()
        gc.collect()
        second = tracemalloc.take_snapshot().filter_traces(filters)
        return sum(stat.size_diff for stat in second.compare_to(first, "filename"))
    finally:
        tracemalloc.stop()
