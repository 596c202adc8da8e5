"""What each generated file of the mount holds, asked of the library (floors 2–3).

Also the mount-only pieces of syntax: search file names, ``<query>?k=N&min_score=X&
format=jsonl|text``, and ``derived/context.md?budget=N`` (the brief in N tokens, 1 ≤ N ≤
1,000,000; any other suffix names nothing). Decisions recorded here:

* The part after the last ``?`` of a search name is a parameter list when it contains
  ``=``; then every parameter must be known (``k``, ``min_score``, ``format`` and the options
  of SPEC §5.1: ``stem``, ``stopwords``, ``in``, ``agent``, ``project``, ``status``,
  ``since``, ``until``, ``session``, ``distinct``), given once, with a valid value — checked
  by :func:`memfs.search.options.parse_options`, the one validator the CLI and the config
  use too — anything else is ``EINVAL`` with the reason in the server's log, never silently
  part of the query. Without ``=`` (``what broke?``, ``why? because``) the ``?`` is text.
  Values are percent-decoded like the query (``project=%2Fsrc%2Fapp``).
* The query part is percent-decoded (``%2F`` is ``/``, ``%3F`` a literal ``?``, ``%25`` a
  ``%``), since a file name cannot hold a ``/``; a ``%`` not followed by two hex digits is
  kept as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

import orjson
from memfs import views
from memfs.errors import BadQuery, NotFound
from memfs.search.options import KEYS as SEARCH_KEYS
from memfs.search.options import parse_options
from memfs.store.session import SessionHandle
from memfs.views.context import MAX_BUDGET

README = """\
# memfs

This directory is an AI coding agent's session memory, served by memfs.

- `sessions/<session>/events.jsonl` is the canonical, append-only log: append one JSON
  event per line (`echo '{"type":"turn.started"}' >> events.jsonl`). Invalid lines are
  refused ("Bad message") and kept in `rejected.jsonl` with the reason.
- `manifest.json` and `index/turns.json` show the live metadata; `index/import-sources.json`,
  in a session `memfs import` made, what it took from each source file.
- `derived/` holds views regenerated from the log when read: `memory.json`,
  `trajectory.jsonl`, `summary.md`, `progress.json`, `progress.md`, `goal.json`,
  `turns/<n>.jsonl`, and `transcript.md` (the whole session as Markdown, for people).
- `derived/context.md` is a brief to paste into an agent's next prompt: goal, progress, open
  todos, last summary, failures and their reasons, files touched, facts — newest first, cut to
  2,000 tokens (~4 bytes each); `cat 'derived/context.md?budget=500'` for another budget.
- Codex `exec --json` lines and VT Code lines are both accepted as they are. Claude Code
  stream-json/transcript lines and Codex rollout lines are refused with the command that
  brings them in (`memfs record`, `memfs import`).
- `search/<query>` (per session, and at the top for all sessions) returns BM25 results as
  JSON lines; add `?k=3`, `?min_score=1.5` or `?format=text` to the name.
  More options, joined with `&`: `stem=english` (`failing` finds `failed`),
  `stopwords=english`, `in=output|all` (commands' outputs too; `all` also the prompts),
  `agent=`, `project=`, `status=failed|completed|open`, `since=7d`, `until=2026-01-31`,
  `session=`, `distinct=session` (one result per session). Write `/` in a value as `%2F`.
  Which when: `search/test fail?stem=english&status=failed` (what failed, however it was
  worded); `search/connection refused?in=output&since=7d` (words only in a command's output);
  `search/retry loop?stem=english&in=all&distinct=session` (find the run: its best match each).
- `usage/daily.json`, `by-model`, `by-project`, `by-agent` (`.json` and `.md`): tokens and
  cost over every session (UTC days); each session's own is `derived/usage.json`.
- `mkdir sessions/<name>` creates a session; nothing can be truncated, renamed or deleted.
""".encode()

SINGLE_README = README.replace(b"sessions/<session>/", b"").replace(
    b"(per session, and at the top for all sessions)", b"").replace(
    b"- `mkdir sessions/<name>` creates a session; nothing", b"- Nothing").replace(
    b"- `usage/daily.json`, `by-model`, `by-project`, `by-agent` (`.json` and `.md`): tokens and\n"
    b"  cost over every session (UTC days); each session's own is `derived/usage.json`.\n",
    b"- `derived/usage.json`: this session's tokens, tool calls and cost.\n")


@dataclass(frozen=True, slots=True)
class Query:
    text: str
    k: int | None = None
    min_score: float | None = None
    format: str = "jsonl"
    params: tuple[tuple[str, str], ...] = ()  # every parameter as given (decoded): the searcher's options


def parse_query(name: str) -> Query | None:
    """A search file name → :class:`Query`; None for an empty query; :class:`BadQuery`
    (``EINVAL``) for an unknown parameter or a bad value."""
    text, sep, suffix = name.rpartition("?")
    if not sep or "=" not in suffix:
        text, suffix = name, ""
    params: dict[str, str] = {}
    for part in suffix.split("&") if suffix else ():
        key, eq, value = part.partition("=")
        if key not in SEARCH_KEYS:
            raise BadQuery(f"search name {name!r}: unknown parameter {key!r} "
                           f"(known: {', '.join(SEARCH_KEYS)}; write a literal '?' as %3F)")
        if not eq:
            raise BadQuery(f"search name {name!r}: parameter {key!r} needs a value ({key}=...)")
        if key in params:
            raise BadQuery(f"search name {name!r}: parameter {key!r} given twice")
        params[key] = unquote(value)
    try:
        options = parse_options(params)
    except BadQuery as exc:
        raise BadQuery(f"search name {name!r}: {exc}") from None
    query = Query(text=unquote(text), k=options.k, min_score=options.min_score, format=options.format,
                  params=tuple(params.items()))
    return query if query.text.strip() else None


def render_results(results: list[dict], fmt: str) -> bytes:
    if fmt == "text":
        lines = [f"{r['score']}\t{r['chunk_id']}\t{' '.join(r['snippet'].split())}" for r in results]
        return "".join(line + "\n" for line in lines).encode()
    return b"".join(orjson.dumps(r) + b"\n" for r in results)


CONTEXT = "context.md"


def context_budget(name: str) -> int | None:
    """The budget of ``context.md?budget=N``; None for any other name."""
    base, sep, suffix = name.partition("?")
    if base != CONTEXT or not sep or not suffix.startswith("budget="):
        return None
    value = suffix[len("budget="):]
    if not value.isdigit() or not 1 <= int(value) <= MAX_BUDGET:
        return None
    return int(value)


def is_view_name(name: str) -> bool:
    """A view every session has: a fixed view, or ``context.md`` with a budget."""
    return name in views.VIEW_NAMES or context_budget(name) is not None


def view_names(handle: SessionHandle) -> list[str]:
    return views.list_names(handle)


def turn_numbers(handle: SessionHandle) -> list[int]:
    return views.list_turns(handle)


def view_bytes(handle: SessionHandle, name: str) -> bytes:
    budget = context_budget(name)
    if budget is not None:
        return views.context_markdown(handle, budget).encode()
    try:
        return views.render_view(handle, name)
    except FileNotFoundError:
        raise NotFound(f"no view {name!r}") from None
