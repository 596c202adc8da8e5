"""For the tests of memfs's C modules, which count their references by hand."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterable


def bytes_kept(churn: Callable[[], None], ignore: Iterable[str] = (), rounds: int = 1) -> int:
    """Bytes still allocated after a further run of ``churn`` (the first warms caches: interned
    strings, exception machinery), the least over ``rounds`` measured runs. A missing ``Py_DECREF``
    in a loop shows up in every run; what background threads (the metadata persister) happen
    to hold at the moment of a measurement does not, so with ``rounds`` > 1 the least is the
    leak.

    ``ignore``: files whose allocations (anywhere in the allocating call stack) do not count —
    e.g. ``pathlib``, which interns every path component it parses, so the churn of temp-file
    names of atomic writes grows the interpreter's table of interned strings now and then.
    """
    ignore = list(ignore)
    churn()
    gc.collect()
    tracemalloc.start(8 if ignore else 1)  # the ignored files are near the allocation
    try:
        filters = [tracemalloc.Filter(False, name, all_frames=True) for name in ignore]
        grown = []
        for _ in range(rounds):
            if not ignore:
                before = tracemalloc.get_traced_memory()[0]
                churn()
                gc.collect()
                grown.append(tracemalloc.get_traced_memory()[0] - before)
                continue
            first = tracemalloc.take_snapshot().filter_traces(filters)
            churn()
            gc.collect()
            second = tracemalloc.take_snapshot().filter_traces(filters)
            grown.append(sum(stat.size_diff for stat in second.compare_to(first, "filename")))
        return min(grown)
    finally:
        tracemalloc.stop()
