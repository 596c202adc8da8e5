"""Text from outside shown to people: control characters made visible (floor 1; no I/O).

Sessions carry text the agents wrote (messages, models, working directories, branches, titles),
and a terminal obeys the control characters in it: ``ESC ] 52`` writes the clipboard, ``ESC [ 2J``
clears the screen, a C1 ``CSI`` (U+009B) does what ``ESC [`` does, a bidi override reorders what
is read. Everything the command line prints that can carry such text, and every Markdown
rendering of a session, goes through :func:`visible` (or :func:`one_line` for one-line fields).

Decisions recorded here:

* A control character is shown as its JSON/Python escape ``\\uXXXX`` (ESC → ``\\u001b``, CSI →
  ``\\u009b``, RLO → ``\\u202e``): readable, one form for every character, and applied to JSON
  text it yields the same JSON (such characters can only stand inside JSON strings, where
  ``\\uXXXX`` means exactly them), so one function serves plain text and JSON alike. A literal
  backslash is left alone, so in plain text ``\\u001b`` may also be what the agent typed; the
  ``--json`` output is the exact form (its backslashes are escaped).
* Replaced: C0 controls except tab and newline (a CR LF pair is a newline; a lone CR is
  replaced: it rewrites the line on a terminal), DEL, C1 (U+0080–U+009F), the bidi embeddings
  and overrides (U+202A–U+202E) and isolates (U+2066–U+2069), and the line and paragraph
  separators U+2028/U+2029.
"""

from __future__ import annotations

import re

_CLASS = "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]"  # what is made visible
_CONTROL = re.compile("\r\n|" + _CLASS)
_ANY = re.compile(_CLASS)  # (the class alone: a quicker scan than the alternation)
_SPACE = re.compile(r"\s+")
_PLAIN_ASCII = bytes(range(0x20, 0x7F)) + b"\t\n"  # the ASCII bytes shown as they are


def _escape(m: re.Match) -> str:
    c = m.group()
    return "\n" if c == "\r\n" else f"\\u{ord(c):04x}"


def visible(text: str) -> str:
    """``text`` with its control characters shown as ``\\uXXXX`` (see the module docstring);
    tabs and newlines kept."""
    if _ANY.search(text) is None:  # (the common case, found faster than by the substitution)
        return text
    return _CONTROL.sub(_escape, text)


def visible_bytes(data: bytes) -> bytes:
    """:func:`visible` of UTF-8 ``data`` (bytes that are not UTF-8 kept as they are), not decoded
    when nothing in it needs showing: a large JSON document, as a rule."""
    if data.isascii() and not data.translate(None, _PLAIN_ASCII):
        return data
    return visible(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


def one_line(text: str) -> str:
    """``text`` on one line: control characters made visible (:func:`visible`), then every run of
    whitespace (newlines and tabs too) one space, trimmed."""
    return _SPACE.sub(" ", visible(text)).strip()
