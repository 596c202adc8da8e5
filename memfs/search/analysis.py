"""Token analysis for the search options ``stem`` and ``stopwords`` (SPEC §5.1).

An :class:`Analyzer` turns a document or a query into the tokens the BM25 index counts:
SPEC §5's tokenizer first (:func:`~memfs.search.tokenize.tokenize`; a query cut to its first
:data:`~memfs.search.tokenize.MAX_QUERY_TOKENS` tokens), then, with ``stopwords=english``,
the English stopword list removed, then, with ``stem=english``, each token replaced by its
Snowball English stem (PyStemmer) — the order bm25s uses, so a stopword is matched before it
is stemmed. With neither option the analyzer is SPEC §5's tokenizer exactly.

:func:`analyzer` returns one shared analyzer per combination; stems are memoized per word (a
bounded cache), as a vocabulary repeats.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, lru_cache

from memfs.search.tokenize import query_tokens, tokenize

# bm25s's STOPWORDS_EN (bm25s/stopwords.py, bm25s 0.3.16, MIT licence:
# https://github.com/xhluca/bm25s), copied as data so that memfs does not depend on bm25s.
STOPWORDS_EN = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they",
    "this", "to", "was", "will", "with",
))

STEM_CACHE = 1 << 16  # words whose stems are remembered


class Analyzer:
    """``doc(text)`` and ``query(text)`` → tokens, for one ``(stem, stopwords)`` choice."""

    __slots__ = ("stem", "stopwords", "_stem_word")

    def __init__(self, stem: str = "none", stopwords: str = "none"):
        self.stem, self.stopwords = stem, stopwords
        self._stem_word: Callable[[str], str] | None = None
        if stem == "english":
            import Stemmer  # PyStemmer (Snowball); loaded only when stemming is asked for

            self._stem_word = lru_cache(maxsize=STEM_CACHE)(Stemmer.Stemmer("english").stemWord)
        elif stem != "none":
            raise ValueError(f"unknown stemmer {stem!r}")
        if stopwords not in ("none", "english"):
            raise ValueError(f"unknown stopword list {stopwords!r}")

    @property
    def plain(self) -> bool:
        """SPEC §5's tokenizer unchanged."""
        return self._stem_word is None and self.stopwords == "none"

    def _analyse(self, tokens: list[str]) -> list[str]:
        if self.stopwords == "english":
            tokens = [t for t in tokens if t not in STOPWORDS_EN]
        if self._stem_word is not None:
            stem = self._stem_word
            tokens = [stem(t) for t in tokens]
        return tokens

    def doc(self, text: str) -> list[str]:
        """A document's tokens."""
        return self._analyse(tokenize(text))

    def query(self, text: str) -> list[str]:
        """A query's tokens (cut as :func:`~memfs.search.tokenize.query_tokens` cuts)."""
        return self._analyse(query_tokens(text))


@cache
def analyzer(stem: str = "none", stopwords: str = "none") -> Analyzer:
    """The shared :class:`Analyzer` of one combination."""
    return Analyzer(stem, stopwords)
