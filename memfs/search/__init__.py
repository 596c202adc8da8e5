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

from typing import TYPE_CHECKING

from memfs._lazy import lazy_exports
from memfs.search.bm25 import recency_factor
from memfs.search.tokenize import MAX_QUERY_TOKENS, query_tokens, tokenize

# the store-backed half loads on first use (PEP 562), so the index and the formula never
# import the store; so does the index (numpy), so that the options, the change feed and the
# mount's start do not import it
_EXPORTS = {
    "DEFAULT_MAX_RESULTS": "memfs.search.index",
    "DEFAULT_MIN_SCORE": "memfs.search.index",
    "MAX_RESULTS": "memfs.search.index",
    "SearchIndex": "memfs.search.index",
    "SearchOptions": "memfs.search.options",
    "parse_options": "memfs.search.options",
    "created_at_of": "memfs.search.searcher",
    "search_store": "memfs.search.searcher",
    "store_searcher": "memfs.search.searcher",
    "sync_from_handle": "memfs.search.searcher",
}

__all__ = [*_EXPORTS, "MAX_QUERY_TOKENS", "query_tokens", "recency_factor", "tokenize"]


if TYPE_CHECKING:  # (what the lazy names are, for the type checker)
    from memfs.search.index import DEFAULT_MAX_RESULTS as DEFAULT_MAX_RESULTS
    from memfs.search.index import DEFAULT_MIN_SCORE as DEFAULT_MIN_SCORE
    from memfs.search.index import MAX_RESULTS as MAX_RESULTS
    from memfs.search.index import SearchIndex as SearchIndex
    from memfs.search.options import SearchOptions as SearchOptions
    from memfs.search.options import parse_options as parse_options
    from memfs.search.searcher import created_at_of as created_at_of
    from memfs.search.searcher import search_store as search_store
    from memfs.search.searcher import store_searcher as store_searcher
    from memfs.search.searcher import sync_from_handle as sync_from_handle

__getattr__ = lazy_exports(globals(), _EXPORTS)  # the store-backed names, imported on first use
