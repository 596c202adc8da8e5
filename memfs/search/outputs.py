"""The ``in=output`` documents (SPEC §5.1): command outputs, tool results, failure details;
and the ``in=all`` prompt documents: the user's prompts.

:func:`event_outputs` is a pure function of one decoded event: a ``command_execution``'s
``aggregated_output``, an item's ``output`` (``tool_output``, the tools an import translated),
an MCP call's result text and error message, an ``error`` item's message, and the reason of a
``turn.failed`` / ``turn.blocked`` / ``error`` event. Each is one document, cut to its first
and last 2 KiB (:func:`memfs.facts.bounded_output`, as the ingest stores a long output). Empty (whitespace-only) texts are none.

:class:`OutputLog` keeps one session's documents and follows its log: each call reads only
the lines appended since the last one; a cap rewrite or another opening of the session starts
over with a new ``generation`` (as :func:`memfs.views.memory_facts` does for facts), so
:meth:`memfs.search.SearchIndex.sync_session` indexes only the new tail.

Decisions recorded here:

* A document's ``turn`` is the retained turn whose byte range holds the line (None outside
  turns), its ``offset`` the line's byte offset in the log.
* An MCP result's text is its ``content`` parts' ``text`` joined by newlines; a
  ``structured_content`` alone is not indexed (it repeats the content as JSON).
* The cut keeps whole UTF-8 characters and marks the gap with ``\\n…\\n``.
* A prompt document is a turn's first prompt (``turn.started``'s ``context.prompt``, else its
  first ``user_message`` item, as the views take the goal), cut as outputs are; a turn whose
  log has none takes its ``index/about.json`` ``turn_notes`` prompt (``offset`` None), and a
  session with no prompt at all its ``first_prompt`` (``turn`` and ``offset`` None).
"""

from __future__ import annotations

import bisect
import itertools
import threading

from memfs.events import decode_stored
from memfs.facts import bounded_output, failure_message

_FAILURES = ("turn.failed", "turn.blocked", "error")
_generations = itertools.count(1)


def _mcp_texts(item: dict) -> list:
    out = []
    result = item.get("result")
    content = result.get("content") if type(result) is dict else None
    if type(content) is list:
        out.append("\n".join(c["text"] for c in content if type(c) is dict and type(c.get("text")) is str))
    error = item.get("error")
    if type(error) is dict:
        out.append(error.get("message"))
    return out


def event_outputs(event: dict) -> list[str]:
    """The output documents of one decoded event (see the module docstring)."""
    etype = event.get("type")
    if etype == "item.completed":
        item = event.get("item")
        if type(item) is not dict:
            return []
        itype = item.get("type")
        if itype == "command_execution":
            texts = [item.get("aggregated_output")]
        elif itype == "mcp_tool_call":
            texts = _mcp_texts(item)
        elif itype == "error":
            texts = [item.get("message")]
        else:
            texts = [item.get("output")]
    elif etype in _FAILURES:
        texts = [failure_message(event)]
    else:
        return []
    return [bounded_output(t) for t in texts if type(t) is str and t.strip()]


def event_prompt(event: dict) -> str | None:
    """The user's prompt one decoded event carries (``turn.started``'s ``context.prompt`` or a
    ``user_message`` item's text), cut as outputs are; None when it carries none."""
    from memfs.views.fold import prompt_text  # floor 3 sibling; imported late so search loads alone

    etype = event.get("type")
    text = None
    if etype == "turn.started":
        context = event.get("context")
        text = context.get("prompt") if type(context) is dict else None
    elif etype == "item.completed":
        item = event.get("item")
        if type(item) is dict and item.get("type") == "user_message":
            text = prompt_text(item)
    return bounded_output(text) if type(text) is str and text.strip() else None


class OutputLog:
    """The output documents of one session, kept in step with its log (thread-safe)."""

    __slots__ = ("lock", "docs", "prompts", "generation", "_key", "_offset", "_prompted")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.docs: list[dict] = []  # {"fact": text, "turn", "offset"}, as the index takes them
        self.prompts: list[dict] = []  # the log's prompt documents, the same shape
        self._prompted: set = set()  # the turns (None: outside any) that have a prompt document
        self.generation = 0
        self._key: tuple | None = None
        self._offset = 0

    def sync(self, handle) -> tuple[list[dict], int]:
        """``(documents, generation)`` of ``handle``'s log as it is now; within one generation
        the list only grows. The list is a copy; the dicts are shared."""
        with self.lock:
            for _attempt in range(3):
                key = (id(handle.reads.opening), handle.rewrites)
                if key != self._key:
                    self.docs, self.prompts, self._offset, self._key = [], [], 0, key
                    self._prompted = set()
                    self.generation = next(_generations)
                found: list[tuple[int, list[str]]] = []
                asked: list[tuple[int, str]] = []
                end = self._offset
                for offset, line in handle.iter_lines(self._offset):
                    end = offset + len(line) + 1
                    decoded = decode_stored(line)
                    if decoded is None:
                        continue
                    texts = event_outputs(decoded[1])
                    if texts:
                        found.append((offset, texts))
                    prompt = event_prompt(decoded[1])
                    if prompt is not None:
                        asked.append((offset, prompt))
                entries = handle.turn_index  # read after the lines: it covers every one of them
                starts = [e["start_offset"] for e in entries]
                new = [{"fact": t, "turn": _turn_at(entries, starts, offset), "offset": offset}
                       for offset, texts in found for t in texts]
                if handle.rewrites == key[1]:  # else the lines were the replaced log's: again
                    self.docs.extend(new)
                    for offset, prompt in asked:
                        turn = _turn_at(entries, starts, offset)
                        if turn is None or turn not in self._prompted:  # a turn's first prompt
                            self._prompted.add(turn)
                            self.prompts.append({"fact": prompt, "turn": turn, "offset": offset})
                    self._offset = end
                    break
            return list(self.docs), self.generation

    def sync_prompts(self, handle) -> tuple[list[dict], tuple]:
        """``(documents, generation)``: the prompts of ``handle``'s session (call after
        :meth:`sync`): the log's, then ``index/about.json``'s for turns the log has none of."""
        from memfs.store import about

        with self.lock:
            meta = about.read(handle.path)
            notes = meta.get("turn_notes")
            extra: list[dict] = []
            for key, note in sorted((notes if type(notes) is dict else {}).items()):
                text = note.get("prompt") if type(note) is dict else None
                if (key.isdigit() and int(key) not in self._prompted and type(text) is str and text.strip()):
                    extra.append({"fact": bounded_output(text), "turn": int(key), "offset": None})
            first = meta.get("first_prompt")
            if not self.prompts and not extra and type(first) is str and first.strip():
                extra.append({"fact": bounded_output(first), "turn": None, "offset": None})
            extra.sort(key=lambda d: -1 if d["turn"] is None else int(d["turn"]))
            return self.prompts + extra, (self.generation, tuple(d["turn"] for d in extra))


def _turn_at(entries: list[dict], starts: list[int], offset: int) -> int | None:
    i = bisect.bisect_right(starts, offset) - 1
    if i < 0:
        return None
    e = entries[i]
    if offset < e["end_offset"] or e.get("outcome") == "open":
        return e["turn_number"]
    return None
