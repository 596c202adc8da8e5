"""BM25 search over the grounded facts of the session memory views (SPEC §5).

* :func:`tokenize` — the §5 tokenizer (documents and queries); :func:`query_tokens` cuts a
  query to :data:`MAX_QUERY_TOKENS`.
* :mod:`memfs.search.bm25` — the formula and the recency factor, written once.
* :class:`SearchIndex` — the incremental index (``set_session``, ``extend_session``,
  ``sync_session``, ``remove_session``, ``search``).
* :func:`store_searcher` (the mount) and :func:`search_store` (``memfs search``) — the index
  kept in step with a sessions root.
* :class:`SearchOptions` / :func:`parse_options` — SPEC §5.1's options (stemming, stopwords,
  outputs, filters, one result per session) and their one validator; the indexes behind them
  are :mod:`memfs.search.corpora`, :mod:`memfs.search.analysis`, :mod:`memfs.search.outputs`.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING


def _import_numpy() -> None:
    """numpy, its BLAS held to one thread: the index uses no BLAS routine, and OpenBLAS's pool
    of one thread per core, started at the import, spins the other cores (as much CPU as the
    rest of the import). The variable is read at the library's load only, so it is set back at
    once: nothing this process starts inherits it."""
    if "numpy" in sys.modules:
        return
    was = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        if was is None:
            del os.environ["OPENBLAS_NUM_THREADS"]
        else:
            os.environ["OPENBLAS_NUM_THREADS"] = was


_import_numpy()  # (before the modules below import it)

from memfs._lazy import lazy_exports  # noqa: E402
from memfs.search.bm25 import recency_factor  # noqa: E402
from memfs.search.index import DEFAULT_MAX_RESULTS, DEFAULT_MIN_SCORE, MAX_RESULTS, SearchIndex  # noqa: E402
from memfs.search.tokenize import MAX_QUERY_TOKENS, query_tokens, tokenize  # noqa: E402

# the store-backed half loads on first use (PEP 562), so the index and the formula never
# import the store
_EXPORTS = {
    "SearchOptions": "memfs.search.options",
    "parse_options": "memfs.search.options",
    "created_at_of": "memfs.search.searcher",
    "search_store": "memfs.search.searcher",
    "store_searcher": "memfs.search.searcher",
    "sync_from_handle": "memfs.search.searcher",
}

__all__ = [*_EXPORTS, "DEFAULT_MAX_RESULTS", "DEFAULT_MIN_SCORE", "MAX_QUERY_TOKENS", "MAX_RESULTS",
           "SearchIndex", "query_tokens", "recency_factor", "tokenize"]


if TYPE_CHECKING:  # (what the lazy names are, for the type checker)
    from memfs.search.options import SearchOptions as SearchOptions
    from memfs.search.options import parse_options as parse_options
    from memfs.search.searcher import created_at_of as created_at_of
    from memfs.search.searcher import search_store as search_store
    from memfs.search.searcher import store_searcher as store_searcher
    from memfs.search.searcher import sync_from_handle as sync_from_handle

__getattr__ = lazy_exports(globals(), _EXPORTS)  # the store-backed names, imported on first use
