"""Text from a session placed in Markdown so that it stays text: no HTML, no links, no
structure of the document's own (SPEC §11 ``--to markdown``; ``derived/transcript.md``).

A message keeps its Markdown (paragraphs, lists, emphasis, code spans and code blocks), but
it cannot forge the transcript's structure nor carry HTML or a link:

* ``<`` outside code becomes ``&lt;`` (no raw HTML, no autolink); ``[`` becomes ``\\[`` (no
  link, image or link reference definition, so no ``javascript:`` URL).
* A line that would open a heading (``#``), a block quote (``>``), a thematic break (``---``,
  ``***``), a setext underline (``===``), a table's delimiter row, or that begins with ``*``
  or ``_`` emphasis (``**Prompt**``, ``_Usage_``) — also after list markers — gets a backslash
  before that character, so it reads as the text it is; list markers themselves are kept.
* A code span is one that opens and closes on the same line; every other backtick is escaped,
  so a span never reaches into another line or block.
* A fenced code block of the message is kept verbatim, its fences moved to the line's start,
  and closed at the message's end if the message left it open, so it never swallows what
  follows.
* Code spans the renderer builds (:func:`code_span`) use a backtick run longer than any inside.
"""

from __future__ import annotations

import bisect
import re

from memfs.text import one_line

_FENCE_OPEN = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")
_FENCE_CLOSE = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*")
_BREAK = re.compile(r"[ \t]*([-*_])(?:[ \t]*\1){2,}[ \t]*")  # a thematic break
_SETEXT = re.compile(r"[ \t]*(?:=+|-+)[ \t]*")
_TABLE_RULE = re.compile(r"[ \t|:-]*-[ \t|:-]*")  # (with a "|": a table's delimiter row, or like one)
_MARKER = re.compile(r"[ \t]*(?:[-+*]|[0-9]{1,9}[.)])(?:[ \t]+|$)")  # a list item's marker
_RUN = re.compile(r"`+")
_PLAIN = re.compile(r"[ \t]*[^ \t#>*_+=|:`~0-9-]")  # a line no block syntax begins (all but an empty one)
_SPECIAL = re.compile(r"[\\`<\[]")
_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _inline(text: str) -> str:
    """One line's inline text: ``<`` and ``[`` escaped outside code spans, backticks that do
    not pair on this line escaped."""
    if _SPECIAL.search(text) is None:
        return text
    runs = [(m.start(), m.end()) for m in _RUN.finditer(text)]
    by_length: dict[int, list[int]] = {}
    for start, end in runs:
        by_length.setdefault(end - start, []).append(start)
    out: list[str] = []
    i, n = 0, len(text)
    while (m := _SPECIAL.search(text, i)) is not None:
        j = m.start()
        out.append(text[i:j])
        c = text[j]
        if c == "\\":
            i = j + 2 if j + 1 < n and text[j + 1] in _PUNCT else j + 1
            out.append(text[j:i])
        elif c == "`":
            end = _RUN.match(text, j).end()  # type: ignore[union-attr]
            same = by_length.get(end - j, [])
            k = bisect.bisect_right(same, j)
            if k < len(same):  # the next run as long closes the span
                i = same[k] + end - j
                out.append(text[j:i])
            else:
                out.append("\\`" * (end - j))
                i = end
        else:
            out.append("&lt;" if c == "<" else "\\[")
            i = j + 1
    out.append(text[i:])
    return "".join(out)


def _plain_line(line: str) -> str:
    """A message's line outside code blocks (see the module docstring)."""
    if _PLAIN.match(line):  # (the common case: it begins with a letter or the like)
        return _inline(line)
    if _BREAK.fullmatch(line) or _SETEXT.fullmatch(line) or ("|" in line and _TABLE_RULE.fullmatch(line)):
        lead = len(line) - len(line.lstrip(" \t"))
        return line[:lead] + "\\" + _inline(line[lead:])
    pos = 0
    while (m := _MARKER.match(line, pos)) is not None and m.end() > pos:
        pos = m.end()
    lead = pos + len(line[pos:]) - len(line[pos:].lstrip(" \t"))
    rest = line[lead:]
    if _BREAK.fullmatch(rest) or _SETEXT.fullmatch(rest):
        return line[:lead] + "\\" + _inline(rest)
    if rest[:1] in ("#", ">") or rest[:3] in ("```", "~~~"):
        return line[:lead] + "\\" + rest[0] + _inline(rest[1:])
    if rest[:1] in ("*", "_"):
        run = len(rest) - len(rest.lstrip(rest[0]))
        return line[:lead] + ("\\" + rest[0]) * run + _inline(rest[run:])
    return line[:lead] + _inline(rest)


def md_block(text: str) -> str:
    """A message's text as Markdown that stays the message's (see the module docstring); no
    trailing newline."""
    out: list[str] = []
    fence: tuple[str, int] | None = None  # the open code block's fence character and length
    for line in text.rstrip("\n").split("\n"):
        if fence is None:
            m = _FENCE_OPEN.fullmatch(line)
            if m and not (m.group(1)[0] == "`" and "`" in m.group(2)):
                fence = (m.group(1)[0], len(m.group(1)))
                out.append(m.group(1) + m.group(2))
            else:
                out.append(_plain_line(line))
            continue
        m = _FENCE_CLOSE.fullmatch(line)
        if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= fence[1]:
            out.append(m.group(1))
            fence = None
        else:
            out.append(line)
    if fence is not None:
        out.append(fence[0] * fence[1])
    return "\n".join(out)


def md_inline(text: str) -> str:
    """``text`` on one line (:func:`memfs.text.one_line`) as Markdown inline text: no HTML, no
    link, no code span reaching past it."""
    return _inline(one_line(text))


def code_span(text: str) -> str:
    """``text`` on one line as a code span, its backticks longer than any run inside."""
    text = one_line(text) or " "
    longest = max((len(m) for m in _RUN.findall(text)), default=0)
    if not longest:
        return f"`{text}`"
    ticks = "`" * (longest + 1)
    return f"{ticks} {text} {ticks}"


def labeled(label: str, text: str) -> str:
    """``label`` and ``text``: on the label's line when it is one line, else below it."""
    if "\n" not in text.strip("\n"):
        return f"{label} {md_inline(text)}\n"
    return f"{label}\n\n{md_block(text)}\n"
