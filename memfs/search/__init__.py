"""BM25 search over the grounded facts of the session memory views (SPEC §5).

* :func:`tokenize` — the §5 tokenizer (documents and queries); :func:`query_tokens` cuts a
  query to :data:`MAX_QUERY_TOKENS`.
* :mod:`memfs.search.bm25` — the formula and the recency factor, written once.
* :class:`SearchIndex` — the incremental index (``set_session``, ``extend_session``,
  ``sync_session``, ``remove_session``, ``search``).
* :func:`store_searcher` (the mount) and :func:`search_store` (``memfs search``) — the index
  kept in step with a sessions root.
"""

from memfs.search.bm25 import recency_factor
from memfs.search.index import DEFAULT_MAX_RESULTS, DEFAULT_MIN_SCORE, MAX_RESULTS, SearchIndex
from memfs.search.searcher import created_at_of, search_store, store_searcher, sync_from_handle
from memfs.search.tokenize import MAX_QUERY_TOKENS, query_tokens, tokenize

__all__ = [
    "DEFAULT_MAX_RESULTS",
    "DEFAULT_MIN_SCORE",
    "MAX_QUERY_TOKENS",
    "MAX_RESULTS",
    "SearchIndex",
    "created_at_of",
    "query_tokens",
    "recency_factor",
    "search_store",
    "store_searcher",
    "sync_from_handle",
    "tokenize",
]
