"""Other agents' line shapes (SPEC §2, §10): which agent's format a decoded line is in.

The one place that knows them, for both uses: the event contract refuses such a line written
straight into a log with a pointer to the command that ingests it (:func:`foreign_format`),
and the ingest picks a translator by them (:mod:`memfs.ingest`). Pure; no I/O.

* **Claude Code** transcript (``~/.claude/projects/*/*.jsonl``): messages ``user`` /
  ``assistant`` / ``system`` / ``summary`` with one of ``parentUuid``, ``sessionId``,
  ``leafUuid``, ``isSidechain``; and its metadata lines (:data:`CLAUDE_METADATA_TYPES`:
  ``queue-operation``, ``attachment``, ``last-prompt``, ``cost-state``, …) with ``sessionId``,
  ``leafUuid`` or ``messageId``. ``stream-json``: ``system`` / ``assistant`` / ``user`` /
  ``result`` / ``stream_event`` with ``session_id`` or ``parent_tool_use_id``, an
  assistant/user ``message`` object, or a system/result ``subtype`` string.
* **Codex** rollout (``~/.codex/sessions/**/rollout-*.jsonl``): a ``timestamp``, a ``type``
  (``session_meta``, ``response_item``, ``event_msg``, ``turn_context``, ``compacted``,
  ``world_state``, …) and an object ``payload`` (:func:`codex_rollout`). (Codex ``exec --json`` *is* this event family: not foreign.)
* **Gemini CLI** (:func:`gemini_shape`): ``--output-format stream-json`` lines and chat files'
  lines (``~/.gemini/tmp/*/chats/``).
"""

from __future__ import annotations

CLAUDE_STREAM_TYPES = frozenset(("system", "assistant", "user", "result", "stream_event"))
CLAUDE_TRANSCRIPT_TYPES = frozenset(("system", "assistant", "user", "summary"))
CLAUDE_METADATA_TYPES = frozenset((
    "summary", "custom-title", "ai-title", "agent-name", "last-prompt", "file-history-snapshot", "attachment",
    "queue-operation", "pr-link", "mode", "cost-state", "tools-used", "api-request", "api-request-blob",
    "api-request-shape", "atis-latch", "tag", "worktree-state", "content-replacement", "progress"))
_CLAUDE_TRANSCRIPT_FIELDS = ("parentUuid", "sessionId", "leafUuid", "isSidechain")
_CLAUDE_METADATA_FIELDS = ("sessionId", "leafUuid", "messageId")
_CLAUDE_STREAM_FIELDS = ("session_id", "parent_tool_use_id")
GEMINI_STREAM_TYPES = ("init", "message", "tool_use", "tool_result", "error", "result")
GEMINI_RECORD_TYPES = ("user", "gemini", "info", "error", "warning")
# the bare lines' types worth a closer look (a line of another type is never foreign by type)
FOREIGN_TYPES = (CLAUDE_STREAM_TYPES | CLAUDE_TRANSCRIPT_TYPES | CLAUDE_METADATA_TYPES
                 | frozenset(GEMINI_STREAM_TYPES) | frozenset(GEMINI_RECORD_TYPES))

_IMPORT = 'use "memfs import"'


def gemini_shape(obj: dict) -> str | None:
    """``"stream"`` or ``"chat"`` when a decoded line is Gemini CLI's, else None. Stream lines
    have a ``type`` of :data:`GEMINI_STREAM_TYPES` and a string ``timestamp``, plus ``init``:
    ``session_id`` + ``model``; ``message``: ``role`` + ``content``; ``tool_use``: ``tool_id``
    + ``tool_name``; ``tool_result``: ``tool_id`` + ``status``; ``error``: ``severity`` +
    ``message``; ``result``: ``status`` and no ``subtype`` (Claude's has one). Chat lines:
    ``sessionId`` + ``projectHash`` (metadata); a ``$set`` object or a ``$rewindTo`` string;
    or a record: string ``id``, a ``type`` of :data:`GEMINI_RECORD_TYPES`, ``content`` and
    ``timestamp``, and none of Claude's ``uuid``/``message``/``sessionId``."""
    kind = obj.get("type")
    if type(kind) is not str:
        if type(obj.get("$set")) is dict or type(obj.get("$rewindTo")) is str:
            return "chat"
        if type(obj.get("sessionId")) is str and type(obj.get("projectHash")) is str:
            return "chat"
        return None
    if type(obj.get("timestamp")) is not str:
        return None
    if kind in GEMINI_STREAM_TYPES:
        if kind == "init" and type(obj.get("session_id")) is str and "model" in obj:
            return "stream"
        if kind == "message" and obj.get("role") in ("user", "assistant") and "content" in obj:
            return "stream"
        if kind == "tool_use" and "tool_id" in obj and "tool_name" in obj:
            return "stream"
        if kind == "tool_result" and "tool_id" in obj and "status" in obj:
            return "stream"
        if kind == "error" and "severity" in obj and "message" in obj:
            return "stream"
        if kind == "result" and "status" in obj and "subtype" not in obj and "is_error" not in obj:
            return "stream"
    if kind in GEMINI_RECORD_TYPES and type(obj.get("id")) is str and "content" in obj \
            and not any(k in obj for k in ("uuid", "message", "sessionId")):
        return "chat"
    return None


def claude_shape(obj: dict) -> str | None:
    """``"transcript"``, ``"metadata"`` (a transcript's metadata line) or ``"stream"`` when a
    decoded line is Claude Code's, else None (see the module docstring)."""
    etype = obj.get("type")
    if type(etype) is not str:
        return None
    if etype in CLAUDE_TRANSCRIPT_TYPES and any(f in obj for f in _CLAUDE_TRANSCRIPT_FIELDS):
        return "transcript"
    if etype in CLAUDE_METADATA_TYPES and any(type(obj.get(f)) is str for f in _CLAUDE_METADATA_FIELDS):
        return "metadata"
    if etype in CLAUDE_STREAM_TYPES and (
            any(f in obj for f in _CLAUDE_STREAM_FIELDS)
            or (etype in ("assistant", "user") and type(obj.get("message")) is dict)
            or (etype in ("system", "result") and type(obj.get("subtype")) is str)):
        return "stream"
    return None


def codex_rollout(obj: dict) -> bool:
    """A Codex rollout line: ``{"timestamp": str, "type": str, "payload": object}`` (Codex adds
    line types from release to release — ``world_state``, ``token_usage_record`` in 0.171 — so
    the envelope is what says it; no type of this family has a ``payload``)."""
    etype = obj.get("type")
    return type(etype) is str and type(obj.get("payload")) is dict and type(obj.get("timestamp")) is str \
        and "." not in etype


def foreign_format(obj: dict) -> str | None:
    """The refusal reason for a decoded bare line in another agent's format — naming the
    format and the command that ingests it — else None."""
    etype = obj.get("type")
    if codex_rollout(obj):
        return f'Codex rollout line ("type":"{etype}"): {_IMPORT}'
    if type(etype) is str and etype not in FOREIGN_TYPES:
        return None
    claude = claude_shape(obj)
    if claude == "transcript":
        return f'Claude Code transcript line ("type":"{etype}"): {_IMPORT}'
    if claude == "metadata":
        return f'Claude Code transcript metadata line ("type":"{etype}"): {_IMPORT}'
    if claude == "stream":
        return f'Claude Code stream-json line ("type":"{etype}"): use "memfs record --format claude" or "memfs import"'
    gemini = gemini_shape(obj)
    if gemini == "stream":
        return (f'Gemini CLI stream-json line ("type":"{etype}"): '
                f'use "memfs record --format gemini" or "memfs import"')
    if gemini == "chat":
        return f'Gemini CLI chat file line: {_IMPORT}'
    return None
