"""The arguments of each MCP tool (SPEC §13): pydantic models that give the tools' input
schemas and validate a call before anything touches the disk.

Unknown arguments are refused (a misspelt option is never silently ignored), and a refusal
is one line (:func:`reason`). Values the library checks itself — search options
(:func:`memfs.search.options.parse_options`), ``since`` (:func:`memfs.store.listing.parse_since`),
session names (:func:`memfs.store.paths.new_session_name_error`) — are only typed here, so each
rule keeps one home.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memfs.search.index import MAX_RESULTS
from memfs.store.listing import STATUSES
from memfs.views.context import DEFAULT_BUDGET, MAX_BUDGET

SESSION_HELP = "a session's directory name, as list_sessions shows it"


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SearchArgs(Args):
    query: str = Field(description="what to look for (BM25 over the sessions' grounded facts)")
    k: int | None = Field(None, ge=1, le=MAX_RESULTS, description="number of results (default 6)")
    min_score: float | None = Field(None, allow_inf_nan=False, description="drop results scoring below this")
    session: str | None = Field(None, description="search this session only (" + SESSION_HELP + ")")
    stem: str | None = Field(None, description="'english': Snowball English stemming of documents and query")
    stopwords: str | None = Field(None, description="'english': drop common English words (with stem=english)")
    in_: str | None = Field(None, alias="in", description="'facts' (default), 'output' (command outputs, tool "
                                                          "results, failures) or 'all'")
    agent: str | None = Field(None, description="only sessions of this agent (codex, claude, gemini, vtcode…)")
    project: str | None = Field(None, description="only sessions of this project (its path or basename)")
    status: str | None = Field(None, description="only turns that are 'failed', 'completed' or 'open'")
    since: str | None = Field(None, description="only turns since: an ISO date (2026-01-31) or an age (7d)")
    until: str | None = Field(None, description="only turns until: an ISO date or an age")
    distinct: str | None = Field(None, description="'session': at most one result (its best) per session")

    def options(self) -> dict[str, str]:
        """The options given, as the query parameters of ``search/<query>?…`` (SPEC §5.1)."""
        given = self.model_dump(by_alias=True, exclude_none=True, exclude={"query"})
        return {key: repr(v) if isinstance(v, float) else str(v) for key, v in given.items()}


class ListSessionsArgs(Args):
    agent: str | None = Field(None, description="only sessions of this agent (claude, codex, gemini, vtcode…)")
    project: str | None = Field(None, description="only sessions of this project: its path or name, or a "
                                                  "directory the session ran in or under")
    status: Literal[STATUSES] | None = Field(None, description="only sessions with this status")  # type: ignore[valid-type]
    since: str | None = Field(None, description="only sessions active since: a date or time (2026-01-31, UTC) "
                                                "or an age (7d, 12h)")
    limit: int = Field(100, ge=1, le=10_000, description="at most this many sessions, most recent first")


class GetContextArgs(Args):
    session: str = Field(description=SESSION_HELP)
    budget: int = Field(DEFAULT_BUDGET, ge=1, le=MAX_BUDGET,
                        description="size of the brief in tokens (about 4 bytes each)")


class ReadTurnArgs(Args):
    session: str = Field(description=SESSION_HELP)
    turn: int = Field(ge=1, description="the turn's number (1 is the first)")


class GetUsageArgs(Args):
    session: str | None = Field(None, description="one session's usage; without it, the whole store's report")
    by: Literal["day", "week", "month", "model", "project", "agent", "session"] = Field(
        "day", description="the report's rows (without session)")
    since: str | None = Field(None, description="the report from this date or age on (without session)")


class AppendNoteArgs(Args):
    session: str = Field(description="an existing session (" + SESSION_HELP + ")")
    text: str | None = Field(None, description="the note: appended as an item.completed of type `kind`")
    kind: Literal["agent_message", "plan"] = Field("agent_message", description="the item type of a text note")
    event: dict[str, Any] | None = Field(None, description="instead of text: one goal.* event object, "
                                                           "e.g. {\"type\":\"goal.created\",\"goal_id\":\"g1\","
                                                           "\"objective\":\"…\"}")


def reason(exc: ValidationError) -> str:
    """A refused call's arguments in one line: ``k: Input should be greater than or equal to 1; …``."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown argument"
        elif err["type"] == "missing":
            msg = "required"
        parts.append(f"{where}: {msg}")
    return "invalid arguments: " + "; ".join(parts)
