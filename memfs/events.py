"""The event contract (SPEC §2): one line of ``events.jsonl`` in, a validated record out.

Two entry points, one per use:

* :func:`parse_line` — for an *append*. Full validation of the envelope and of every known
  event type; a bare event (``{"type": ...}`` with no envelope) is wrapped in an envelope
  carrying :data:`SCHEMA_VERSION`, its own bytes kept verbatim inside. Raises
  :class:`~memfs.errors.ValidationError` with one specific reason on refusal, for example
  ``turn.failed: "message" must be a string``, or, when several required fields are missing,
  all of them: ``thread.completed: missing required fields thread_id, session_id, …``.
* :func:`decode_stored` — for a *rescan* of bytes already in a log. Never raises: it returns
  ``None`` for a line the rescan must skip (blank, not UTF-8, not JSON, not an envelope, a
  malformed lifecycle event). Non-lifecycle events are accepted without field checks there,
  so a log written by an older or laxer writer keeps its lines.

Decisions recorded here where the spec is silent:

* A line is an *envelope* when it has both a string ``schema_version`` and an object
  ``event``; otherwise, when it has ``event`` or ``schema_version`` at all, it is a malformed
  envelope; otherwise, with a ``type``, it is a bare event.
* Counters the spec calls "integer" that count or measure something (``wait_ms``,
  ``image_count``, ``num_turns``, message counts, token counts) must be non-negative, as the
  unsigned fields of the VT Code types they mirror; a JSON boolean is never an integer.
* Fields the spec names without a type (``tool_name``, ``trigger``, ``mode``, ``delta``, …)
  must be strings; ``arguments`` of a command execution may be any value.
* Optional fields may be absent or ``null``.
* Two dialects of the one event family are accepted as they are (SPEC §2): VT Code's and
  Codex ``exec --json``'s (``turn.failed`` with ``{"error": {"message"}}``, ``mcp_tool_call``
  with ``server``/``tool``, ``todo_list``, ``declined``…). Enumerated values inside items
  (statuses, change kinds) are open: any string. Rules with two forms use the ``present``
  check (:func:`present`), so each form is refused with its own reason.
* A bare line in another agent's format (Claude Code, Codex rollout, Gemini CLI: memfs.formats)
  is refused with a reason naming the format and the command that ingests it
  (:func:`foreign_format`). An *envelope* whose event looks like one is not: it is this
  family's line by construction, an unknown event.

The rules live here, as data (:data:`EVENT_FIELDS`), with the Python functions that word the
refusals of lines that are not well-formed envelopes and the interpreter that applies the
tables to each line (compiled into closures once, at import).

No I/O happens here.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import orjson

from memfs.errors import ValidationError
from memfs.formats import foreign_format

SCHEMA_VERSION = "0.18.0"
_ENVELOPE_HEAD = b'{"schema_version":"' + SCHEMA_VERSION.encode() + b'","event":'


class Kind(enum.IntEnum):
    """What an event means to the turn state machine (SPEC §3.1)."""

    OTHER = 0
    THREAD_STARTED = 1
    THREAD_COMPLETED = 2
    TURN_STARTED = 3
    TURN_COMPLETED = 4
    TURN_FAILED = 5


LIFECYCLE_KINDS = {
    "thread.started": Kind.THREAD_STARTED,
    "thread.completed": Kind.THREAD_COMPLETED,
    "turn.started": Kind.TURN_STARTED,
    "turn.completed": Kind.TURN_COMPLETED,
    "turn.failed": Kind.TURN_FAILED,
}


Record = tuple[bytes, str, dict, Kind]
"""An accepted line, as :func:`parse_line` returns it: ``(line, type, event, kind)`` — the exact
bytes to store (no trailing newline), the event's type, the decoded event and what it means to
the turn state machine. A plain tuple, unpacked by position: it is made and freed once per
appended line, and a named tuple costs several times as much to make and free."""


# --- field tables ---------------------------------------------------------------------------
# The contract as data, interpreted by _compile below. A check is a tuple starting with its kind
# and what a value must be (the end of a refusal's reason):
#   ("str"|"bool"|"int"|"uint"|"number"|"object"|"any"|"str_list", what)
#   ("one_of", what, frozenset_of_str)      ("equal", what, value)
#   ("fields", what, [field, ...])          an object with these fields, checked in order
#   ("list_of", what, check)                a list whose every element passes ``check``
#   ("by", what, key, {value: check}, fallback)       an object, checked by the check its
#                                           string ``key`` selects (the fallback otherwise)
#   ("present", what, [(key, check), ...], fallback)  an object, checked by the check of the
#                                           first ``key`` it has with a non-null value
# The cases and fallbacks of "by" and "present", and an event type's own check, are checks of
# an object ("fields", "by" or "present"). A field is (name, required, check, what it must be
# when missing — None: the check's own words). A required field must be present and pass (null
# fails every check but "any"); an optional one may be absent or null.

STR = ("str", "a string")
BOOL = ("bool", "a boolean")
INT = ("int", "an integer")
UINT = ("uint", "a non-negative integer")
NUMBER = ("number", "a number")
OBJECT = ("object", "an object")
ANY = ("any", "any value")
STR_LIST = ("str_list", "a list of strings")


def one_of(*values: str) -> tuple:
    return ("one_of", "one of " + "/".join(values), frozenset(values))


def equal_to(value: str) -> tuple:
    return ("equal", f'"{value}"', value)


def fields(*specs: tuple, what: str = "an object") -> tuple:
    """An object with these fields, checked in order: two or more missing required fields are
    named together (``missing required fields a, b``), else the first wrong one is reported."""
    return ("fields", what, list(specs))


def present(*cases: tuple, otherwise: tuple) -> tuple:
    """An object checked by the case of the first key it has (with a non-null value), else by
    ``otherwise`` — a rule of two dialects: "``message``, or ``error`` with a ``message``".
    Each case is ``(key, check of an object)``."""
    return ("present", "an object", list(cases), otherwise)


def req(name: str, check: tuple, missing: str | None = None) -> tuple:
    return (name, True, check, missing)


def opt(name: str, check: tuple) -> tuple:
    return (name, False, check, None)


USAGE = fields(*(opt(name, UINT) for name in
                 ("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")))

# What a close says of its turn beyond ``usage`` (memfs extensions, SPEC §10 "Per-turn facts",
# stamped by the ingest): the agent, the model (the last request's), and each model request with
# its tokens in memfs's disjoint form (``input`` excludes cache reads and writes; ``output``
# includes ``reasoning``) and its time.
REQUEST = fields(opt("model", STR), opt("at", STR),
                 *(opt(name, UINT) for name in ("input", "cached_input", "cache_creation", "output", "reasoning")),
                 what="a request object")
TURN_FACTS = (opt("agent", STR), opt("model", STR), opt("requests", ("list_of", "a list of request objects", REQUEST)))

TURN_CONTEXT = fields(
    opt("task_id", STR),
    opt("turn_id", STR),
    opt("actor_id", STR),
    opt("origin", one_of("user", "correction", "plan_approval", "continuation", "retry")),
    opt("timestamp", STR),
)

# Enumerations inside items are open (SPEC §2): a status or kind is any string, and the views
# read a value they do not know as unknown. Only lifecycle events are strict.
FILE_CHANGES = ("list_of", "a list of {path, kind}", fields(req("path", STR), req("kind", STR)))

TODO_ITEMS = ("list_of", "a list of {text, completed}", fields(req("text", STR), req("completed", BOOL)))

ERROR_MESSAGE = fields(req("message", STR), what='an object with a string "message"')


def _item(*specific: tuple) -> tuple:
    """A ThreadItem of a known type (its ``type`` already matched): string ``id``, the type's
    own fields, optional ``context`` object."""
    return fields(req("id", STR), *specific, opt("context", OBJECT))


# ThreadItem by its ``type``; an unknown type gets only the base checks.
THREAD_ITEM = ("by", "an object", "type", {
    "agent_message": _item(req("text", STR)),
    "plan": _item(req("text", STR)),
    "reasoning": _item(req("text", STR), opt("stage", STR)),
    "decision": _item(req("summary", STR), req("rationale", STR)),
    # status: completed/failed/in_progress, Codex also declined; others read as unknown
    "command_execution": _item(req("command", STR), req("status", STR),
                               opt("aggregated_output", STR), opt("exit_code", INT), opt("arguments", ANY)),
    "tool_invocation": _item(req("tool_name", STR), req("status", STR)),
    "tool_output": _item(req("call_id", STR), req("status", STR), opt("output", STR)),
    # status: completed/failed, Codex also in_progress
    "file_change": _item(req("status", STR), req("changes", FILE_CHANGES)),
    # VT Code names the tool in ``tool_name``; Codex gives ``server`` + ``tool`` and the call
    "mcp_tool_call": present(
        ("tool_name", _item(req("tool_name", STR))),
        ("tool", _item(req("tool", STR), opt("server", STR), opt("arguments", ANY), opt("result", OBJECT),
                       opt("error", ERROR_MESSAGE), opt("status", STR))),
        otherwise=_item(req("tool_name", ("str", 'a string (or "tool", with "server", as Codex writes it)')))),
    "todo_list": _item(req("items", TODO_ITEMS)),
    "web_search": _item(req("query", STR), opt("action", ANY)),
    "harness": _item(req("event", STR), opt("message", STR)),
    "error": _item(req("message", STR)),
}, fields(req("id", STR), req("type", STR), opt("context", OBJECT)))

ITEM_EVENT = fields(req("item", THREAD_ITEM))

# Event fields by type (SPEC §2). Types not listed are accepted as unknown events.
EVENT_FIELDS: dict[str, tuple] = {
    "thread.started": fields(req("thread_id", STR)),
    "thread.completed": fields(
        req("thread_id", STR), req("session_id", STR), req("outcome_code", STR), req("subtype", STR),
        req("num_turns", UINT), opt("completed_at", STR), opt("result", STR), opt("stop_reason", STR),
        opt("total_cost_usd", NUMBER), req("usage", USAGE, "a Usage object")),
    "thread.compact_boundary": fields(
        req("thread_id", STR), req("trigger", STR), req("mode", STR),
        req("original_message_count", UINT), req("compacted_message_count", UINT)),
    "context.reset": fields(
        req("thread_id", STR), req("turn_id", STR), req("trigger", STR), req("plan_preserved", BOOL),
        req("previous_context_usage_percent", NUMBER), req("tool_budget_reset", BOOL)),
    "turn.started": fields(opt("token_breakdown", OBJECT), opt("context", TURN_CONTEXT)),
    "turn.completed": fields(opt("completed_at", STR), opt("in_progress_exec_sessions", STR_LIST),
                             req("usage", USAGE, "a Usage object"), *TURN_FACTS),
    # VT Code: a string ``message``; Codex: ``{"error": {"message": …}}``
    "turn.failed": present(
        ("message", fields(req("message", STR), opt("completed_at", STR), opt("usage", USAGE), *TURN_FACTS)),
        ("error", fields(req("error", ERROR_MESSAGE), opt("completed_at", STR), opt("usage", USAGE), *TURN_FACTS)),
        otherwise=fields(req("message", ("str", 'a string (or "error" an object with a string "message", '
                                                'as Codex writes it)')))),
    "turn.blocked": fields(req("message", STR), opt("completed_at", STR), opt("last_tool", STR),
                           opt("usage", USAGE)),
    "item.started": ITEM_EVENT,
    "item.updated": ITEM_EVENT,
    "item.completed": ITEM_EVENT,
    "permission.requested": fields(req("tool_name", STR)),
    "permission.resolved": fields(req("tool_name", STR), req("decision", one_of("allow", "deny", "cancelled", "followup")),
                                  req("wait_ms", UINT)),
    "interjected": fields(req("source", one_of("direct", "queue")), req("image_count", UINT),
                          req("redirect_kind", equal_to("interjection"))),
    "plan.delta": fields(req("thread_id", STR), req("turn_id", STR), req("item_id", STR), req("delta", STR)),
    "plan.approval.requested": fields(req("thread_id", STR), req("turn_id", STR)),
    "plan.approval.resolved": fields(req("thread_id", STR), req("turn_id", STR), req("decision", STR),
                                     req("automatic", BOOL)),
    "matrix.updated": fields(req("spec", fields(req("id", STR)))),
    "error": fields(req("message", STR)),
}


# --- lines ----------------------------------------------------------------------------------


_NEWLINE_REASON = "line contains a newline: append one JSON object per line"


def _undecodable_reason(line: bytes, exc: orjson.JSONDecodeError) -> str:
    if not line.strip():
        return "line is blank: expected one JSON object"
    if b"\n" in line:  # likely several lines given as one: say so rather than "not JSON"
        return _NEWLINE_REASON
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return "line is not valid UTF-8"
    return f"line is not valid JSON: {exc}"


# --- other agents' formats, refused with the command that ingests them (SPEC §2, §10) --------
# Only lines that are not envelopes are looked at (bare lines: the way those tools write), and
# only on their top-level shape (memfs.formats: each also needs a field of its format), so that
# an unknown event of this family is never taken for one.

def _unwrap_slow(obj: Any, line: bytes) -> tuple[dict, bytes]:
    """The event and stored bytes of a decoded line that is not a well-formed envelope:
    a bare event is wrapped; anything else is refused with its reason."""
    if type(obj) is not dict:
        raise ValidationError("line is not a JSON object")
    reason = foreign_format(obj)
    if reason is not None:
        raise ValidationError(reason)
    if "event" in obj or "schema_version" in obj:
        if type(obj.get("schema_version")) is not str:
            raise ValidationError('envelope: "schema_version" must be a string')
        raise ValidationError('envelope: "event" must be an object')
    if "type" in obj:
        return obj, _ENVELOPE_HEAD + line + b"}"  # bare event: wrapped, its bytes verbatim
    raise ValidationError('line is neither an envelope {"schema_version","event"} nor a bare event with "type"')


# --- the interpreter of the tables -----------------------------------------------------------
# A compiled check takes a value and returns None when it passes, else (path, what): path None
# for the value itself, a dotted path below it (``item.changes[0].path``), or a list of them
# when two or more required fields are missing (what is then _MISSING).

_MISSING = "missing required fields"
_ABSENT = object()
_TYPE_REASON = 'event: "type" must be a string'
_loads = orjson.loads
_OTHER = Kind.OTHER
_EXACT = {"str": str, "bool": bool, "int": int, "object": dict}  # checks that are one type test


def _join_one(head: str, tail: str) -> str:
    return head + tail if tail[0] == "[" else f"{head}.{tail}"


def _join(head: str, tail: str | list | None) -> str | list:
    if tail is None:
        return head
    if isinstance(tail, list):
        return [_join_one(head, one) for one in tail]
    return _join_one(head, tail)


def _fields(what: str, specs: list) -> Callable:
    """Every field, in order: the first wrong value is kept (only presence is checked after
    it); missing required fields win over it: one is reported as a wrong field (with what it
    must be), two or more as the list of their names."""
    compiled = [(name, required, _EXACT.get(check[0]), _compile(check), check[1] if missing is None else missing)
                for name, required, check, missing in specs]
    not_object = (None, what)

    def run(obj):
        if type(obj) is not dict:
            return not_object
        first = missing = wrong = None
        for name, required, exact, check, missing_what in compiled:
            value = obj.get(name, _ABSENT)
            if type(value) is exact:  # (the common case first: a value of the one right type)
                continue
            if value is _ABSENT:
                if not required:
                    continue
                if first is None:
                    first = (name, missing_what)
                elif missing is None:
                    missing = [first[0], name]
                else:
                    missing.append(name)
            elif wrong is None and first is None and (value is not None or required):
                refusal = check(value)
                if refusal is not None:
                    wrong = (_join(name, refusal[0]), refusal[1])
        if missing is not None:
            return missing, _MISSING
        return first if first is not None else wrong

    return run


def _compile(spec: tuple) -> Callable:
    """A check (the format of :data:`EVENT_FIELDS`) as a function of a value."""
    kind, what = spec[0], spec[1]
    bad = (None, what)
    if kind == "fields":
        return _fields(what, spec[2])
    if kind == "list_of":
        item = _compile(spec[2])

        def list_of(v):
            if type(v) is not list:
                return bad
            for i, element in enumerate(v):
                refusal = item(element)
                if refusal is not None:
                    return _join(f"[{i}]", refusal[0]), refusal[1]
            return None
        return list_of
    if kind == "by":
        key, cases, fallback = spec[2], {v: _compile(c) for v, c in spec[3].items()}, _compile(spec[4])

        def by(v):
            if type(v) is not dict:
                return bad
            selector = v.get(key)
            return (cases.get(selector, fallback) if type(selector) is str else fallback)(v)
        return by
    if kind == "present":
        keyed, fallback = [(key, _compile(c)) for key, c in spec[2]], _compile(spec[3])

        def present(v):
            if type(v) is not dict:
                return bad
            for key, check in keyed:
                if v.get(key) is not None:
                    return check(v)
            return fallback(v)
        return present
    simple = {
        "str": lambda v: type(v) is str,
        "bool": lambda v: type(v) is bool,
        "int": lambda v: type(v) is int,  # a JSON boolean is never an integer
        "uint": lambda v: type(v) is int and v >= 0,
        "number": lambda v: type(v) is int or type(v) is float,
        "object": lambda v: type(v) is dict,
        "any": lambda v: True,
        "str_list": lambda v: type(v) is list and all(type(s) is str for s in v),
    }
    if kind == "one_of":
        values = spec[2]
        test = lambda v: type(v) is str and v in values  # noqa: E731
    elif kind == "equal":
        value = spec[2]
        test = lambda v: v == value  # noqa: E731
    else:
        test = simple[kind]
    return lambda v: None if test(v) else bad


_TABLE = {etype: (_compile(check), LIFECYCLE_KINDS.get(etype, Kind.OTHER)) for etype, check in EVENT_FIELDS.items()}


def _refusal(etype: str, refusal: tuple) -> str:
    path, what = refusal
    if what is _MISSING:
        return f"{etype}: missing required fields {', '.join(path)}"
    return f'{etype}: "{path}" must be {what}'


def parse_line(raw: bytes) -> Record:
    """Validate one line for appending and return what to store.

    ``raw`` may end with ``\\n`` (and ``\\r\\n``); it must not contain any other newline. A
    well-formed envelope is stored verbatim; a bare event is wrapped (:func:`_unwrap_slow`). The
    event's fields are checked against :data:`EVENT_FIELDS`. Raises :class:`ValidationError`
    with a one-line reason, for example ``turn.failed: "message" must be a string``.
    """
    if type(raw) is not bytes:
        raise TypeError(f"parse_line takes bytes, not {type(raw).__name__}")
    # the writer's line: one trailing \n, then one trailing \r, dropped
    line = raw if raw.endswith(b"}") else raw.removesuffix(b"\n").removesuffix(b"\r")
    try:
        obj = _loads(line)
    except orjson.JSONDecodeError as exc:
        raise ValidationError(_undecodable_reason(line, exc)) from None
    if 10 in line:  # a newline (an int: memchr): JSON may span lines; a stored line may not
        raise ValidationError(_NEWLINE_REASON)
    if type(obj) is dict and type(event := obj.get("event")) is dict and type(obj.get("schema_version")) is str:
        stored = line
    else:
        event, stored = _unwrap_slow(obj, line)
    etype = event.get("type")
    if type(etype) is not str:
        raise ValidationError(_TYPE_REASON)
    entry = _TABLE.get(etype)
    if entry is None:
        return stored, etype, event, _OTHER
    check, kind = entry
    refusal = check(event)
    if refusal is not None:
        raise ValidationError(_refusal(etype, refusal))
    return stored, etype, event, kind


def decode_stored(line: bytes) -> tuple[Kind, dict] | None:
    """Decode a line already in a log, with the rescan's acceptance rules (SPEC §3.3).

    Returns ``(kind, event)`` or ``None`` when the rescan must skip the line: blank, not UTF-8,
    not JSON, not an envelope with a string ``schema_version`` and an ``event`` object with a
    string ``type``, or a lifecycle event that fails its checks (other events are not checked).
    """
    try:
        obj = _loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict:
        return None
    event = obj.get("event")
    if type(event) is not dict or type(obj.get("schema_version")) is not str:
        return None
    etype = event.get("type")
    if type(etype) is not str:
        return None
    entry = _TABLE.get(etype)
    if entry is None:
        return _OTHER, event
    check, kind = entry
    if kind is not _OTHER and check(event) is not None:  # only lifecycle events: they make turns
        return None
    return kind, event
