"""The event contract (SPEC §2): one line of ``events.jsonl`` in, a validated record out.

Two entry points, one per use:

* :func:`parse_line` — for an *append*. Full validation of the envelope and of every known
  event type; a bare event (``{"type": ...}`` with no envelope) is wrapped in an envelope
  carrying :data:`SCHEMA_VERSION`, its own bytes kept verbatim inside. Raises
  :class:`~memfs.errors.ValidationError` with one specific reason on refusal, for example
  ``turn.failed: "message" must be a string``.
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

No I/O happens here.
"""

from __future__ import annotations

import enum
from typing import Any, Callable, NamedTuple

import orjson

from memfs.errors import ValidationError

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
_OTHER = Kind.OTHER


class Record(NamedTuple):
    """An accepted line: the exact bytes to store (no trailing newline) and its decoding.

    A named tuple because it is built once per appended line and a tuple is the cheapest
    object Python builds (see :func:`parse_line`).
    """

    line: bytes
    type: str
    event: dict
    kind: Kind


_new_record = tuple.__new__  # Record(...) through its generated __new__ costs 2.5x more


# --- field checks -------------------------------------------------------------------------
# A check is (predicate, what-it-must-be). Predicates see a decoded JSON value; bool is
# excluded from integers explicitly because Python's bool is an int.


class _Bad(Exception):
    """Internal: carries the dotted path of a wrong field and what it must be."""

    def __init__(self, path: str, what: str):
        self.path = path
        self.what = what


Check = tuple[Callable[[Any], bool], str]

STR: Check = (lambda v: type(v) is str, "a string")
BOOL: Check = (lambda v: type(v) is bool, "a boolean")
INT: Check = (lambda v: type(v) is int, "an integer")
UINT: Check = (lambda v: type(v) is int and v >= 0, "a non-negative integer")
NUMBER: Check = (lambda v: type(v) is int or type(v) is float, "a number")
OBJECT: Check = (lambda v: type(v) is dict, "an object")
ANY: Check = (lambda v: True, "any value")
STR_LIST: Check = (
    lambda v: type(v) is list and all(type(x) is str for x in v),
    "a list of strings",
)


def one_of(*values: str) -> Check:
    allowed = frozenset(values)
    return (lambda v: type(v) is str and v in allowed, "one of " + "/".join(values))


def equal_to(value: str) -> Check:
    return (lambda v: v == value, f'"{value}"')


# Simple checks are compiled to inline ``type(v) is T`` tests (see _compile); a Python call per
# field would cost more than parsing the JSON.
_INLINE = {id(STR): "type(v) is str", id(BOOL): "type(v) is bool", id(INT): "type(v) is int",
           id(UINT): "type(v) is int and v >= 0", id(OBJECT): "type(v) is dict",
           id(NUMBER): "type(v) is int or type(v) is float"}

_MISSING = object()
_TYPE_ONLY = {id(STR): "str", id(BOOL): "bool", id(INT): "int", id(OBJECT): "dict"}


def _check_lines(required: dict, optional: dict, prefix: str, extras: tuple, var: str, indent: str,
                 env: dict) -> list[str]:
    """Source lines checking the fields of the object in ``var`` (see :func:`_compile`)."""
    lines = []
    for name, check in [*required.items(), *optional.items()]:
        test = _INLINE.get(id(check))
        if test is None:
            key = f"p{len(env)}"
            env[key] = check[0]
            test = f"{key}(v)"
        if name in required and id(check) in _TYPE_ONLY:  # a missing field reads None: not T
            cond = f"type({var}.get({name!r})) is not {_TYPE_ONLY[id(check)]}"
        elif name in required:
            lines.append(f"{indent}v = {var}.get({name!r}, _MISSING)")
            cond = f"v is _MISSING or not ({test})"
        else:
            lines.append(f"{indent}v = {var}.get({name!r})")
            cond = f"v is not None and not ({test})"
        lines.append(f"{indent}if {cond}: raise _Bad({prefix + name!r}, {check[1]!r})")
    for extra in extras:
        key = f"x{len(env)}"
        env[key] = extra
        lines.append(f"{indent}{key}({var})")
    return lines


def _compile(required: dict, optional: dict, prefix: str,
             extras: tuple[Callable[[dict], None], ...] = ()) -> Callable[[dict], None]:
    """Build one checker for a field table: it raises :class:`_Bad` on the first wrong field.

    Required fields must be present and pass; optional ones must pass when present and not
    null; then each of ``extras`` is called with the object. One generated function per
    table, so a valid event costs one Python call.
    """
    env: dict[str, Any] = {"_Bad": _Bad, "_MISSING": _MISSING}
    lines = ["def check(obj):", *_check_lines(required, optional, prefix, extras, "obj", "    ", env),
             "    return None"]
    exec("\n".join(lines), env)
    return env["check"]


_USAGE_FIELDS = ("input_tokens", "cached_input_tokens", "cache_creation_tokens", "output_tokens")


def _check_usage(value: Any, path: str) -> None:
    if type(value) is not dict:
        raise _Bad(path, "an object")
    for name in _USAGE_FIELDS:
        v = value.get(name)
        if v is not None and not (type(v) is int and v >= 0):
            raise _Bad(f"{path}.{name}", "a non-negative integer")


_CONTEXT_OPTIONAL = {
    "task_id": STR,
    "turn_id": STR,
    "actor_id": STR,
    "origin": one_of("user", "correction", "plan_approval", "continuation", "retry"),
    "timestamp": STR,
}

_check_context = _compile({}, _CONTEXT_OPTIONAL, "context.")

_FILE_CHANGE_KIND = one_of("add", "delete", "update")
_check_change = _compile({"path": STR, "kind": _FILE_CHANGE_KIND}, {}, "")


def _file_changes(item: dict) -> None:
    changes = item.get("changes")
    if type(changes) is not list:
        raise _Bad("item.changes", "a list of {path, kind}")
    for i, change in enumerate(changes):
        if type(change) is not dict:
            raise _Bad(f"item.changes[{i}]", "an object")
        try:
            _check_change(change)
        except _Bad as bad:
            raise _Bad(f"item.changes[{i}].{bad.path}", bad.what) from None


# ThreadItem fields by item type: (required, optional, extras). Every item also has a string
# ``id``, a string ``type`` and an optional ``context`` object (_ITEM_BASE).
_ITEM_BASE = ({"id": STR, "type": STR}, {"context": OBJECT})
_ITEM_FIELDS: dict[str, tuple[dict, dict, tuple]] = {
    "agent_message": ({"text": STR}, {}, ()),
    "plan": ({"text": STR}, {}, ()),
    "reasoning": ({"text": STR}, {"stage": STR}, ()),
    "decision": ({"summary": STR, "rationale": STR}, {}, ()),
    "command_execution": (
        {"command": STR, "status": one_of("completed", "failed", "in_progress")},
        {"aggregated_output": STR, "exit_code": INT, "arguments": ANY},
        (),
    ),
    "tool_invocation": ({"tool_name": STR, "status": STR}, {}, ()),
    "tool_output": ({"call_id": STR, "status": STR}, {"output": STR}, ()),
    "file_change": ({"status": one_of("completed", "failed")}, {}, (_file_changes,)),
    "mcp_tool_call": ({"tool_name": STR}, {}, ()),
    "web_search": ({"query": STR}, {}, ()),
    "harness": ({"event": STR}, {"message": STR}, ()),
    "error": ({"message": STR}, {}, ()),
}

def _compile_item_event() -> Callable[[dict], None]:
    """The whole check of an ``item.*`` event as one generated function: the item must be an
    object; then by its ``type`` (most common first), that type's fields — an unknown type
    gets only the base checks (``id``, ``type``, ``context``)."""
    env: dict[str, Any] = {"_Bad": _Bad, "_MISSING": _MISSING}
    lines = ["def check(event):",
             "    item = event.get('item')",
             "    if type(item) is not dict: raise _Bad('item', 'an object')",
             "    t = item.get('type')"]
    for itype, (req, opt, extras) in _ITEM_FIELDS.items():
        # (reaching this branch proves "type": no need to test it again)
        lines.append(f"    if t == {itype!r}:")
        lines += _check_lines({"id": STR, **req}, {**_ITEM_BASE[1], **opt}, "item.", extras, "item", "        ", env)
        lines.append("        return None")
    lines += _check_lines(*_ITEM_BASE, "item.", (), "item", "    ", env)
    exec("\n".join(lines), env)
    return env["check"]


_check_item_event = _compile_item_event()


def _usage_required(event: dict) -> None:
    if "usage" not in event:
        raise _Bad("usage", "a Usage object")
    _check_usage(event["usage"], "usage")


def _usage_optional(event: dict) -> None:
    if event.get("usage") is not None:
        _check_usage(event["usage"], "usage")


def _turn_context(event: dict) -> None:
    context = event.get("context")
    if context is not None:
        if type(context) is not dict:
            raise _Bad("context", "an object")
        _check_context(context)


def _matrix_spec(event: dict) -> None:
    if type(event["spec"].get("id")) is not str:
        raise _Bad("spec.id", "a string")


# Event fields by type: (required, optional, extras), or the check itself.
_EVENT_FIELDS: dict[str, tuple[dict, dict, tuple] | Callable[[dict], None]] = {
    "thread.started": ({"thread_id": STR}, {}, ()),
    "thread.completed": (
        {"thread_id": STR, "session_id": STR, "outcome_code": STR, "subtype": STR, "num_turns": UINT},
        {"completed_at": STR, "result": STR, "stop_reason": STR, "total_cost_usd": NUMBER},
        (_usage_required,),
    ),
    "thread.compact_boundary": (
        {
            "thread_id": STR,
            "trigger": STR,
            "mode": STR,
            "original_message_count": UINT,
            "compacted_message_count": UINT,
        },
        {},
        (),
    ),
    "context.reset": (
        {
            "thread_id": STR,
            "turn_id": STR,
            "trigger": STR,
            "plan_preserved": BOOL,
            "previous_context_usage_percent": NUMBER,
            "tool_budget_reset": BOOL,
        },
        {},
        (),
    ),
    "turn.started": ({}, {"token_breakdown": OBJECT}, (_turn_context,)),
    "turn.completed": ({}, {"completed_at": STR, "in_progress_exec_sessions": STR_LIST}, (_usage_required,)),
    "turn.failed": ({"message": STR}, {"completed_at": STR}, (_usage_optional,)),
    "turn.blocked": ({"message": STR}, {"completed_at": STR, "last_tool": STR}, (_usage_optional,)),
    "item.started": _check_item_event,
    "item.updated": _check_item_event,
    "item.completed": _check_item_event,
    "permission.requested": ({"tool_name": STR}, {}, ()),
    "permission.resolved": (
        {"tool_name": STR, "decision": one_of("allow", "deny", "cancelled", "followup"), "wait_ms": UINT},
        {},
        (),
    ),
    "interjected": (
        {"source": one_of("direct", "queue"), "image_count": UINT, "redirect_kind": equal_to("interjection")},
        {},
        (),
    ),
    "plan.delta": ({"thread_id": STR, "turn_id": STR, "item_id": STR, "delta": STR}, {}, ()),
    "plan.approval.requested": ({"thread_id": STR, "turn_id": STR}, {}, ()),
    "plan.approval.resolved": ({"thread_id": STR, "turn_id": STR, "decision": STR, "automatic": BOOL}, {}, ()),
    "matrix.updated": ({"spec": OBJECT}, {}, (_matrix_spec,)),
    "error": ({"message": STR}, {}, ()),
}

_EVENT_CHECKS = {t: spec if callable(spec) else _compile(*spec[:2], "", spec[2]) for t, spec in _EVENT_FIELDS.items()}


# --- lines ----------------------------------------------------------------------------------


def strip_line(raw: bytes) -> bytes:
    """Drop one trailing ``\\n`` and then one trailing ``\\r``: the writer's line, as stored."""
    if raw[-1:] == b"\n":
        raw = raw[:-1]
    if raw[-1:] == b"\r":
        raw = raw[:-1]
    return raw


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


def _unwrap_slow(obj: Any, line: bytes) -> tuple[dict, bytes]:
    """The event and stored bytes of a decoded line that is not a well-formed envelope:
    a bare event is wrapped; anything else is refused with its reason."""
    if type(obj) is not dict:
        raise ValidationError("line is not a JSON object")
    if "event" in obj or "schema_version" in obj:
        if type(obj.get("schema_version")) is not str:
            raise ValidationError('envelope: "schema_version" must be a string')
        raise ValidationError('envelope: "event" must be an object')
    if "type" in obj:
        return obj, _ENVELOPE_HEAD + line + b"}"  # bare event: wrapped, its bytes verbatim
    raise ValidationError('line is neither an envelope {"schema_version","event"} nor a bare event with "type"')


def parse_line(raw: bytes) -> Record:
    """Validate one line for appending and return what to store.

    ``raw`` may end with ``\\n`` (and ``\\r\\n``); it must not contain any other newline.
    Raises :class:`ValidationError` with a one-line reason.
    """
    # The common case (a well-formed envelope) is the straight path through this function;
    # everything unusual is handled out of line.
    line = raw if raw[-1:] == b"}" else strip_line(raw)
    try:
        obj = _loads(line)
    except _JSONDecodeError as exc:
        raise ValidationError(_undecodable_reason(line, exc)) from None
    if line.find(10) >= 0:  # JSON may span lines; a stored line may not (find beats `in`)
        raise ValidationError(_NEWLINE_REASON)
    if type(obj) is dict and type(event := obj.get("event")) is dict and type(obj.get("schema_version")) is str:
        stored = line
    else:
        event, stored = _unwrap_slow(obj, line)
    etype = event.get("type")
    if type(etype) is not str:
        raise ValidationError('event: "type" must be a string')
    check, kind = _CHECK_AND_KIND.get(etype, _UNKNOWN_TYPE)
    if check is not None:
        try:
            check(event)
        except _Bad as bad:
            raise ValidationError(f'{etype}: "{bad.path}" must be {bad.what}') from None
    return _new_record(Record, (stored, etype, event, kind))


_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_KINDS = LIFECYCLE_KINDS
_CHECK_AND_KIND = {etype: (check, LIFECYCLE_KINDS.get(etype, _OTHER)) for etype, check in _EVENT_CHECKS.items()}
_UNKNOWN_TYPE = (None, _OTHER)
_LIFECYCLE_CHECKS = {etype: _EVENT_CHECKS[etype] for etype in LIFECYCLE_KINDS}


def decode_stored(line: bytes) -> tuple[Kind, dict] | None:
    """Decode a line already in a log, with the rescan's acceptance rules (SPEC §3.3).

    Returns ``(kind, event)`` or ``None`` when the rescan must skip the line: blank, not
    UTF-8, not JSON, not an envelope with a string ``schema_version`` and an ``event`` object
    with a string ``type``, or a lifecycle event that fails its checks.
    """
    try:
        obj = _loads(line)
    except _JSONDecodeError:
        return None
    if type(obj) is not dict:
        return None
    event = obj.get("event")
    if type(event) is not dict or type(obj.get("schema_version")) is not str:
        return None
    etype = event.get("type")
    if type(etype) is not str:  # (checked first: a list or an object is not even hashable)
        return None
    kind = _KINDS.get(etype)
    if kind is None:
        return _OTHER, event
    try:
        _LIFECYCLE_CHECKS[etype](event)
    except _Bad:
        return None
    return kind, event
