"""The search tokenizer (SPEC §5), the same for documents and queries.

Walk the text's Unicode characters; a run of alphanumeric characters (``str.isalnum``) is one
token, lowercased with full Unicode lowercase; any other character ends the token. No
stopwords, no stemming, duplicates kept: ``"Retry the RETRY-loop"`` → ``["retry", "the",
"retry", "loop"]``.

Decisions recorded here:

* Lowercasing is per character, as the spec words it ("alphanumeric characters are lowercased
  and joined"). ``str.lower`` on a whole token differs from that in exactly one place, the
  context-dependent Greek final sigma (``"ΟΔΟΣ".lower()`` ends in ``ς``), so a token holding a
  capital sigma is lowercased character by character and ``Σ`` always becomes ``σ``. A
  character whose lowercase form is longer (``İ`` → ``i̇``) keeps its whole lowercase form.
* The regex class ``[^\\W_]`` matches exactly the characters ``str.isalnum`` accepts (checked
  over every code point by the tests); it is used because it is much faster
  than a Python loop.
* A query is cut to its first :data:`MAX_QUERY_TOKENS` tokens (:func:`query_tokens`), and only
  that much of the text is scanned, so a pathological query (a 10 MB file name through the CLI,
  10,000 tokens) costs a bounded amount of work.
"""

from __future__ import annotations

import re
from itertools import islice

# A query longer than this many tokens is cut (repeated tokens count, as they do in the score).
MAX_QUERY_TOKENS = 32

_TOKEN = re.compile(r"[^\W_]+")


def _lower(token: str) -> str:
    if "Σ" in token:
        return "".join(c.lower() for c in token)
    return token.lower()


def tokenize(text: str) -> list[str]:
    """All tokens of ``text`` in order (SPEC §5)."""
    if text.isascii():  # ASCII lowercase maps letters to letters: lowering first is the same
        return _TOKEN.findall(text.lower())
    return [_lower(m) for m in _TOKEN.findall(text)]


def query_tokens(text: str, limit: int = MAX_QUERY_TOKENS) -> list[str]:
    """The first ``limit`` tokens of a query; the text after them is not even scanned."""
    return [_lower(m.group()) for m in islice(_TOKEN.finditer(text), limit)]
