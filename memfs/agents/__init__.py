"""One home per agent (issue 53): ``memfs/agents/<agent>/`` holds how memfs reads that agent's
records and writes its native format, and this package lists them (:data:`AGENTS`, found by
their folders, so adding an agent is adding a folder; docs/design.md "One folder per agent" says
what a folder provides). The runners ask it, never an agent by name: which format a line is in
(:func:`line_formats`, :func:`owner_of`, :func:`agent_of_kind`), which agent a command runs
(:func:`by_command`, :func:`command_of`), who reads, writes and resumes (:func:`reader`,
:func:`writer`, :func:`resumer`). A folder's modules are imported on first use only: this
package is read by the store and the views, which never load an agent's reader.

The origin of a log (which agent wrote it: :mod:`memfs.agents.origin`) is re-exported here under
its former names.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING

from memfs.agents.origin import (  # noqa: F401  (the names memfs.agents always had)
    CLAUDE,
    CLAUDE_CODE,
    CODEX,
    HEAD_BYTES,
    UNKNOWN,
    VTCODE,
    Origin,
    agent_name,
    run_local_id,
)

if TYPE_CHECKING:
    from memfs.agents.common import LineFormat, Shapes

AGENTS = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg))  # claude, codex, gemini, opencode


def _part(agent: str, part: str) -> ModuleType | None:
    if agent not in AGENTS:
        return None
    name = f"{__name__}.{agent}.{part}"
    return importlib.import_module(name) if importlib.util.find_spec(name) is not None else None


@cache
def shapes(agent: str | None) -> Shapes | None:
    """The table of ``agent`` (its ``shapes.SHAPES``), or None for an agent without a folder."""
    module = _part(agent, "shapes") if isinstance(agent, str) else None
    return module.SHAPES if module is not None else None


def reader(agent: str) -> ModuleType | None:
    """``agent``'s ``read`` module (its translators: ``TRANSLATORS``, kind → class), or None."""
    return _part(agent, "read")


def writer(agent: str) -> ModuleType | None:
    """``agent``'s ``write`` module (``render``), or None: memfs writes no file for it."""
    return _part(agent, "write")


def resumer(agent: str) -> ModuleType | None:
    """``agent``'s ``resume`` module (``resume(root, session, args, home, max_events, cwd,
    tell)``: its own way to continue a session, when its CLI does not go on with the exported
    file), or None: :func:`memfs.export.resume.resume_session` exports and imports back."""
    return _part(agent, "resume")


def writers() -> tuple[str, ...]:
    """The agents memfs exports to (those whose folder has a ``write.py``)."""
    return tuple(a for a in AGENTS if importlib.util.find_spec(f"{__name__}.{a}.write") is not None)


def recorded_disjoint(agent: str | None) -> bool:
    """Whether a close's ``usage`` of ``agent`` counts ``input_tokens`` without the cache (its
    table says so: Claude); any other agent, known or not, counts the cache inside it."""
    table = shapes(agent)
    return table is not None and table.usage.recorded_disjoint


@cache
def line_formats() -> tuple[tuple[str, LineFormat], ...]:
    """Every agent's record formats (its table's ``formats``) with the agent, in the order
    :func:`memfs.ingest.classify` asks them (rank, then agent)."""
    found = [(f.rank, name, f) for name in AGENTS for f in getattr(shapes(name), "formats", ())]
    return tuple((name, f) for _, name, f in sorted(found, key=lambda row: row[:2]))


def owner_of(kind: str | None) -> str | None:
    """The agent whose folder reads translator ``kind`` (``native``: Codex's, which reads this
    event family as ``exec --json`` writes it), or None."""
    return next((name for name, f in line_formats() if f.kind == kind), None)


def agent_of_kind(kind: str | None) -> str | None:
    """The agent a session read by translator ``kind`` is that agent's (None for this event
    family, which any agent or memfs writes)."""
    return next((name for name, f in line_formats() if f.kind == kind and f.attributed), None)


def command_of(agent: str) -> str:
    """The name of ``agent``'s command (its table's ``command``; else the agent's name)."""
    return getattr(shapes(agent), "command", None) or agent


def by_command(program: str) -> str | None:
    """The agent whose command is named ``program`` (its table's ``command``), or None."""
    return next((name for name in AGENTS if getattr(shapes(name), "command", None) == program), None)
