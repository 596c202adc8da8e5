"""numpy for the search modules, imported with its BLAS held to one thread: the index uses no
BLAS routine, and OpenBLAS's pool of one thread per core, started at the import, spins the other
cores (as much CPU as the rest of the import). The variable is read at the library's load only,
so it is set back at once: nothing this process starts inherits it. Every search module imports
numpy from here (``from memfs.search.numpy_once import np``)."""

from __future__ import annotations

import os
import sys


def _load():
    if "numpy" in sys.modules:
        return sys.modules["numpy"]
    was = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy
    finally:
        if was is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = was
    return numpy


np = _load()
