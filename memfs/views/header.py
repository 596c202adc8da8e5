"""The block ``summary.md`` and ``context.md`` begin with (SPEC §10 "Session metadata"): what
the session is about, from its ``index/about.json`` (:mod:`memfs.store.about`)::

    **Title:** Fix the flaky retry test
    **Agent:** claude 2.1.332, model claude-sonnet-4-5
    **Project:** /home/u/memfs, branch main
    **Cwd:** /home/u/memfs/src
    **First prompt:** Fix the flaky retry test in tests/test_net.py; it fails one run in ten…
    **Run:** failed, started 2026-01-01T00:00:00Z, ended 2026-01-01T00:05:00Z
    **Parent session:** 3f2a9c1e-…
    **Sub-agents:** 3f2a9c1e-…-agent-a1, 3f2a9c1e-…-agent-b2

A line is left out when what it says is unknown; no metadata, no block. Every value comes from
the agent's files (untrusted): it is shown on one line, control characters as spaces, and cut
(:data:`CHARS`; the first prompt at :data:`PROMPT_CHARS`, at most :data:`MAX_CHILDREN`
sub-agents named).
"""

from __future__ import annotations

from memfs.store.listing import cut
from memfs.text import one_line

CHARS = 200
PROMPT_CHARS = 300
MAX_CHILDREN = 10


def _get(about: dict, key: str, chars: int = CHARS) -> str | None:
    value = about.get(key)
    if type(value) is not str:
        return None
    return cut(one_line(value), chars) or None


def block(about: dict) -> str:
    """The block (each line ends with ``\\n``), ``""`` when ``about`` says nothing shown here."""
    lines = []

    def line(label: str, head: str | None, *tail: tuple[str, str | None]) -> None:
        parts = [head] if head else []
        parts += [f"{word} {value}" for word, value in tail if value]
        if parts:
            lines.append(f"**{label}:** {', '.join(parts)}\n")

    line("Title", _get(about, "title"))
    agent = " ".join(v for v in (_get(about, "agent"), _get(about, "agent_version")) if v)
    line("Agent", agent, ("model", _get(about, "model")))
    line("Project", _get(about, "project"), ("branch", _get(about, "git_branch")))
    line("Cwd", _get(about, "cwd"))
    line("First prompt", _get(about, "first_prompt", PROMPT_CHARS))
    line("Run", _get(about, "status"), ("started", _get(about, "started_at")), ("ended", _get(about, "ended_at")))
    line("Parent session", _get(about, "parent_session"))
    children = [c for c in (about.get("children") or []) if type(c) is str and c] \
        if type(about.get("children")) is list else []
    if children:
        named = [cut(one_line(c), CHARS) for c in children[:MAX_CHILDREN]]
        more = f", … and {len(children) - MAX_CHILDREN} more" if len(children) > MAX_CHILDREN else ""
        lines.append(f"**Sub-agents:** {', '.join(named)}{more}\n")
    return "".join(lines)
