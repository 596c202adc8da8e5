"""The event contract (SPEC §2): what parse_line accepts and refuses, with which reason, what
it stores, and the rescan's acceptance rules (decode_stored)."""

from __future__ import annotations

import copy
from pathlib import Path

import orjson
import pytest
from memfs.errors import ValidationError
from memfs.events import LIFECYCLE_KINDS, SCHEMA_VERSION, Kind, decode_stored, parse_line
from memfs.facts import MAX_FACT_BYTES, event_facts, normalize_fact

from refcounts import bytes_kept

MISSING = object()
FIXTURES = Path(__file__).parent / "fixtures"

ITEM = {"id": "i1", "type": "agent_message", "text": "hello"}

# One valid event of every known type, with every required field present.
VALID = {
    "thread.started": {"thread_id": "t"},
    "thread.completed": {"thread_id": "t", "session_id": "s", "outcome_code": "completed",
                         "subtype": "success", "usage": {}, "num_turns": 1},
    "thread.compact_boundary": {"thread_id": "t", "trigger": "auto", "mode": "summary",
                                "original_message_count": 40, "compacted_message_count": 5},
    "context.reset": {"thread_id": "t", "turn_id": "u", "trigger": "budget", "plan_preserved": True,
                      "previous_context_usage_percent": 93.5, "tool_budget_reset": False},
    "turn.started": {},
    "turn.completed": {"usage": {}},
    "turn.failed": {"message": "boom"},
    "turn.blocked": {"message": "waiting"},
    "item.started": {"item": ITEM},
    "item.updated": {"item": ITEM},
    "item.completed": {"item": ITEM},
    "permission.requested": {"tool_name": "shell"},
    "permission.resolved": {"tool_name": "shell", "decision": "allow", "wait_ms": 12},
    "interjected": {"source": "direct", "image_count": 0, "redirect_kind": "interjection"},
    "plan.delta": {"thread_id": "t", "turn_id": "u", "item_id": "p", "delta": "- [ ] step"},
    "plan.approval.requested": {"thread_id": "t", "turn_id": "u"},
    "plan.approval.resolved": {"thread_id": "t", "turn_id": "u", "decision": "approve", "automatic": False},
    "matrix.updated": {"spec": {"id": "m1"}},
    "error": {"message": "bad"},
}

STRING = "a string"
UINT = "a non-negative integer"
BOOL = "a boolean"
NUMBER = "a number"
OBJECT = "an object"

# (type, field, bad value or MISSING, what the reason says the field must be)
BAD_FIELDS = [
    ("thread.started", "thread_id", MISSING, STRING),
    ("thread.started", "thread_id", 7, STRING),
    ("thread.completed", "thread_id", MISSING, STRING),
    ("thread.completed", "session_id", None, STRING),
    ("thread.completed", "outcome_code", 1, STRING),
    ("thread.completed", "subtype", MISSING, STRING),
    ("thread.completed", "num_turns", -1, UINT),
    ("thread.completed", "num_turns", True, UINT),
    ("thread.completed", "num_turns", 1.5, UINT),
    ("thread.completed", "usage", MISSING, "a Usage object"),
    ("thread.completed", "usage", [1], OBJECT),
    ("thread.completed", "total_cost_usd", "1", NUMBER),
    ("thread.completed", "completed_at", 5, STRING),
    ("thread.compact_boundary", "trigger", MISSING, STRING),
    ("thread.compact_boundary", "mode", False, STRING),
    ("thread.compact_boundary", "original_message_count", "40", UINT),
    ("thread.compact_boundary", "compacted_message_count", MISSING, UINT),
    ("context.reset", "turn_id", MISSING, STRING),
    ("context.reset", "plan_preserved", "yes", BOOL),
    ("context.reset", "previous_context_usage_percent", "93", NUMBER),
    ("context.reset", "tool_budget_reset", 0, BOOL),
    ("turn.started", "token_breakdown", 5, OBJECT),
    ("turn.started", "context", "ctx", OBJECT),
    ("turn.completed", "usage", MISSING, "a Usage object"),
    ("turn.completed", "usage", "none", OBJECT),
    ("turn.completed", "usage", None, OBJECT),
    ("turn.completed", "completed_at", 1, STRING),
    ("turn.completed", "in_progress_exec_sessions", ["a", 1], "a list of strings"),
    ("turn.failed", "message", MISSING, 'a string (or "error" an object with a string "message", as Codex writes it)'),
    ("turn.failed", "message", 42, STRING),
    ("turn.failed", "usage", 3, OBJECT),
    ("turn.blocked", "message", None, STRING),
    ("turn.blocked", "last_tool", 1, STRING),
    ("item.completed", "item", MISSING, OBJECT),
    ("item.started", "item", [], OBJECT),
    ("item.updated", "item", "x", OBJECT),
    ("permission.requested", "tool_name", MISSING, STRING),
    ("permission.resolved", "decision", "maybe", "one of allow/deny/cancelled/followup"),
    ("permission.resolved", "wait_ms", "12", UINT),
    ("permission.resolved", "wait_ms", MISSING, UINT),
    ("interjected", "source", "elsewhere", "one of direct/queue"),
    ("interjected", "image_count", None, UINT),
    ("interjected", "redirect_kind", "other", '"interjection"'),
    ("plan.delta", "delta", MISSING, STRING),
    ("plan.delta", "item_id", 3, STRING),
    ("plan.approval.requested", "turn_id", MISSING, STRING),
    ("plan.approval.resolved", "automatic", "no", BOOL),
    ("plan.approval.resolved", "decision", MISSING, STRING),
    ("matrix.updated", "spec", MISSING, OBJECT),
    ("matrix.updated", "spec", [], OBJECT),
    ("error", "message", MISSING, STRING),
]


def line_of(event: dict, envelope: bool = True) -> bytes:
    return orjson.dumps({"schema_version": SCHEMA_VERSION, "event": event} if envelope else event)


def refusal(raw: bytes) -> str:
    with pytest.raises(ValidationError) as info:
        parse_line(raw)
    assert info.value.errno_name == "EBADMSG"
    return str(info.value)


@pytest.mark.parametrize("etype", sorted(VALID))
def test_every_known_type_is_accepted_with_its_required_fields(etype):
    event = {"type": etype, **VALID[etype]}
    assert parse_line(line_of(event)) == (line_of(event), etype, event, LIFECYCLE_KINDS.get(etype, Kind.OTHER))


@pytest.mark.parametrize(("etype", "field", "value", "what"), BAD_FIELDS,
                         ids=[f"{t}.{f}={'missing' if v is MISSING else v!r}" for t, f, v, _ in BAD_FIELDS])
@pytest.mark.parametrize("envelope", [True, False], ids=["envelope", "bare"])
def test_wrong_or_missing_field_gives_its_specific_reason(etype, field, value, what, envelope):
    event = {"type": etype, **copy.deepcopy(VALID[etype])}
    if value is MISSING:
        event.pop(field, None)
    else:
        event[field] = value
    assert refusal(line_of(event, envelope)) == f'{etype}: "{field}" must be {what}'


@pytest.mark.parametrize("etype", [t for t, fields in VALID.items() if fields and t != "turn.completed"])
def test_removing_any_required_field_is_refused(etype):
    for field in VALID[etype]:
        event = {"type": etype, **VALID[etype]}
        del event[field]
        assert refusal(line_of(event)).startswith(f'{etype}: "{field}" must be ')


def required_fields(etype: str) -> list[str]:
    """The required fields of a type, in the order its table checks them (a VALID event
    without any of them is refused naming each)."""
    from memfs.events import EVENT_FIELDS

    check = EVENT_FIELDS[etype]
    return [name for name, required, _, _ in check[2] if required] if check[0] == "fields" else []


@pytest.mark.parametrize("etype", [t for t in VALID if len(required_fields(t)) > 1])
@pytest.mark.parametrize("envelope", [True, False], ids=["envelope", "bare"])
def test_every_missing_required_field_is_named_in_one_reason(etype, envelope):
    names = required_fields(etype)
    assert refusal(line_of({"type": etype}, envelope)) == f"{etype}: missing required fields {', '.join(names)}"
    for keep in names:  # all but one missing: the others, named in one reason
        others = [n for n in names if n != keep]
        event = {"type": etype, keep: VALID[etype][keep]}
        expected = f"{etype}: missing required fields {', '.join(others)}" if len(others) > 1 else \
            f'{etype}: "{others[0]}" must be '
        assert refusal(line_of(event, envelope)).startswith(expected)


def test_thread_completed_names_all_its_missing_fields_and_they_come_before_a_wrong_value():
    reason = refusal(b'{"type":"thread.completed"}')
    assert reason == ("thread.completed: missing required fields thread_id, session_id, outcome_code, subtype, "
                      "num_turns, usage")
    reason = refusal(line_of({"type": "thread.completed", "thread_id": 5, "session_id": "s", "subtype": "x",
                              "num_turns": -1, "usage": {}}))
    assert reason == 'thread.completed: "outcome_code" must be a string'  # one missing: said as before
    reason = refusal(line_of({"type": "thread.completed", "thread_id": 5, "session_id": "s", "num_turns": 1}))
    assert reason == "thread.completed: missing required fields outcome_code, subtype, usage"


def test_missing_fields_inside_items_and_lists_are_named_with_their_paths():
    assert refusal(line_of({"type": "item.completed", "item": {"type": "agent_message"}})) == \
        "item.completed: missing required fields item.id, item.text"
    reason = refusal(line_of({"type": "item.completed", "item": {"id": "f", "type": "file_change", "status": "ok",
                                                                  "changes": [{"path": "a", "kind": "add"}, {}]}}))
    assert reason == "item.completed: missing required fields item.changes[1].path, item.changes[1].kind"
    assert refusal(line_of({"type": "item.completed", "item": {"id": "f", "type": "file_change"}})) == \
        "item.completed: missing required fields item.status, item.changes"
    # a rescan skips such a lifecycle line, and a kept non-lifecycle one, as before
    assert decode_stored(line_of({"type": "thread.completed"})) is None
    assert decode_stored(line_of({"type": "item.completed", "item": {}})) is not None


@pytest.mark.parametrize(("usage", "path"), [
    ({"input_tokens": -1}, "usage.input_tokens"),
    ({"cached_input_tokens": "3"}, "usage.cached_input_tokens"),
    ({"cache_creation_tokens": 1.0}, "usage.cache_creation_tokens"),
    ({"output_tokens": True}, "usage.output_tokens"),
])
def test_usage_counters_are_non_negative_integers(usage, path):
    reason = refusal(line_of({"type": "turn.completed", "usage": usage}))
    assert reason == f'turn.completed: "{path}" must be a non-negative integer'


@pytest.mark.parametrize("event, kind", [
    ({"type": "turn.completed", "usage": {"input_tokens": None, "output_tokens": 3}}, Kind.TURN_COMPLETED),
    ({"type": "turn.failed", "message": "m", "usage": None, "completed_at": None}, Kind.TURN_FAILED),
    ({"type": "turn.started", "context": None, "token_breakdown": None}, Kind.TURN_STARTED),
])
def test_usage_counters_may_be_missing_or_null_and_optional_fields_null(event, kind):
    line = line_of(event)
    stored, etype, decoded, got = parse_line(line)
    assert (etype, decoded, got) == (event["type"], event, kind)  # accepted as a lifecycle event
    assert decode_stored(stored) == (kind, event)  # and a rescan counts it the same way


def test_turn_started_context_is_checked():
    ok = {"task_id": "t", "turn_id": "u", "actor_id": "a", "origin": "retry", "timestamp": "2026-01-01T00:00:00Z"}
    parse_line(line_of({"type": "turn.started", "context": ok, "token_breakdown": {"input": 3}}))
    reason = refusal(line_of({"type": "turn.started", "context": {"origin": "whim"}}))
    assert reason == 'turn.started: "context.origin" must be one of user/correction/plan_approval/continuation/retry'
    assert refusal(line_of({"type": "turn.started", "context": {"task_id": 1}})) == \
        'turn.started: "context.task_id" must be a string'


ITEMS_OK = [
    {"id": "a", "type": "agent_message", "text": "t"},
    {"id": "p", "type": "plan", "text": "- [ ] x"},
    {"id": "r", "type": "reasoning", "text": "t", "stage": "draft"},
    {"id": "d", "type": "decision", "summary": "s", "rationale": "r"},
    {"id": "c", "type": "command_execution", "command": "ls", "status": "completed", "exit_code": -1,
     "aggregated_output": "x", "arguments": {"any": ["thing"]}},
    {"id": "ti", "type": "tool_invocation", "tool_name": "grep", "status": "running"},
    {"id": "to", "type": "tool_output", "call_id": "c1", "status": "ok", "output": "o"},
    {"id": "f", "type": "file_change", "changes": [{"path": "a.py", "kind": "add"}], "status": "failed"},
    {"id": "f0", "type": "file_change", "changes": [], "status": "completed"},
    {"id": "m", "type": "mcp_tool_call", "tool_name": "x"},
    {"id": "w", "type": "web_search", "query": "q"},
    {"id": "h", "type": "harness", "event": "e", "message": "m"},
    {"id": "e", "type": "error", "message": "m"},
    {"id": "u", "type": "never-heard-of-it", "whatever": [1, 2]},
    {"id": "x", "type": "agent_message", "text": "t", "context": {"k": 1}},
    # Codex's dialect (SPEC §2): and enumerations inside items are open
    {"id": "item_3", "type": "mcp_tool_call", "server": "docs", "tool": "search", "arguments": {"q": "retry"},
     "result": {"content": [{"type": "text", "text": "ok"}], "structured_content": None}, "error": None,
     "status": "completed"},
    {"id": "item_4", "type": "mcp_tool_call", "server": "docs", "tool": "search", "arguments": None,
     "result": None, "error": {"message": "timeout"}, "status": "failed"},
    {"id": "item_5", "type": "mcp_tool_call", "tool_name": None, "tool": "search"},
    {"id": "c", "type": "command_execution", "command": "git push", "aggregated_output": "", "exit_code": None,
     "status": "declined"},
    {"id": "c", "type": "command_execution", "command": "ls", "status": "a status from the future"},
    {"id": "f", "type": "file_change", "changes": [{"path": "a", "kind": "update"}], "status": "in_progress"},
    {"id": "f", "type": "file_change", "changes": [{"path": "a", "kind": "move"}], "status": "completed"},
    {"id": "t", "type": "todo_list", "items": [{"text": "read", "completed": True}, {"text": "fix", "completed": False}]},
    {"id": "t", "type": "todo_list", "items": []},
    {"id": "w", "type": "web_search", "query": "q", "action": {"type": "search", "query": "q"}},
    {"id": "i", "type": "collab_tool_call", "tool": "spawn_agent", "status": "in_progress"},
]

ITEMS_BAD = [
    ({"type": "agent_message", "text": "t"}, "item.id", STRING),
    ({"id": 5, "type": "agent_message", "text": "t"}, "item.id", STRING),
    ({"id": "a", "text": "t"}, "item.type", STRING),
    ({"id": "a", "type": "agent_message"}, "item.text", STRING),
    ({"id": "a", "type": "agent_message", "text": "t", "context": "c"}, "item.context", OBJECT),
    ({"id": "r", "type": "reasoning", "text": "t", "stage": 1}, "item.stage", STRING),
    ({"id": "d", "type": "decision", "summary": "s"}, "item.rationale", STRING),
    ({"id": "c", "type": "command_execution", "command": "ls", "status": 0}, "item.status", STRING),
    ({"id": "c", "type": "command_execution", "command": "ls"}, "item.status", STRING),
    ({"id": "c", "type": "command_execution", "command": "ls", "status": "failed", "exit_code": "1"},
     "item.exit_code", "an integer"),
    ({"id": "c", "type": "command_execution", "status": "failed"}, "item.command", STRING),
    ({"id": "t", "type": "tool_output", "status": "ok"}, "item.call_id", STRING),
    ({"id": "f", "type": "file_change", "status": "completed"}, "item.changes", "a list of {path, kind}"),
    ({"id": "f", "type": "file_change", "changes": [{"path": "a", "kind": None}], "status": "completed"},
     "item.changes[0].kind", STRING),
    ({"id": "f", "type": "file_change", "changes": [{"path": "a", "kind": "add"}, {"kind": "add"}],
      "status": "completed"}, "item.changes[1].path", STRING),
    ({"id": "f", "type": "file_change", "changes": ["a"], "status": "completed"}, "item.changes[0]", OBJECT),
    ({"id": "f", "type": "file_change", "changes": [], "status": True}, "item.status", STRING),
    ({"id": "m", "type": "mcp_tool_call", "server": "docs"}, "item.tool_name",
     'a string (or "tool", with "server", as Codex writes it)'),
    ({"id": "m", "type": "mcp_tool_call", "tool_name": 3}, "item.tool_name", STRING),
    ({"id": "m", "type": "mcp_tool_call", "tool": ["x"]}, "item.tool", STRING),
    ({"id": "m", "type": "mcp_tool_call", "tool": "x", "server": 1}, "item.server", STRING),
    ({"id": "m", "type": "mcp_tool_call", "tool": "x", "error": {"msg": "no"}}, "item.error.message", STRING),
    ({"id": "m", "type": "mcp_tool_call", "tool": "x", "error": "no"}, "item.error",
     'an object with a string "message"'),
    ({"id": "m", "type": "mcp_tool_call", "tool": "x", "result": []}, "item.result", OBJECT),
    ({"id": "t", "type": "todo_list"}, "item.items", "a list of {text, completed}"),
    ({"id": "t", "type": "todo_list", "items": [{"text": "a", "completed": "no"}]}, "item.items[0].completed", BOOL),
    ({"id": "t", "type": "todo_list", "items": [{"completed": False}]}, "item.items[0].text", STRING),
    ({"id": "w", "type": "web_search"}, "item.query", STRING),
    ({"id": "h", "type": "harness", "message": "m"}, "item.event", STRING),
    ({"id": "e", "type": "error", "message": 1}, "item.message", STRING),
    ({"type": "mystery"}, "item.id", STRING),
]


@pytest.mark.parametrize("item", ITEMS_OK, ids=[i["type"] for i in ITEMS_OK])
def test_thread_items_accepted(item):
    for etype in ("item.started", "item.updated", "item.completed"):
        _, _, event, _ = parse_line(line_of({"type": etype, "item": item}))
        assert event["item"] == item


@pytest.mark.parametrize(("item", "path", "what"), ITEMS_BAD, ids=[p for _, p, _ in ITEMS_BAD])
def test_thread_items_refused_with_the_field_path(item, path, what):
    assert refusal(line_of({"type": "item.completed", "item": item})) == f'item.completed: "{path}" must be {what}'


def test_matrix_spec_needs_a_string_id():
    assert refusal(line_of({"type": "matrix.updated", "spec": {"id": 3}})) == \
        'matrix.updated: "spec.id" must be a string'


def test_thread_completed_unknown_subtype_reads_as_unknown():
    event = {"type": "thread.completed", **VALID["thread.completed"], "subtype": "error_from_the_future"}
    assert parse_line(line_of(event))[3] is Kind.THREAD_COMPLETED


@pytest.mark.parametrize(("etype", "kind"), [
    ("thread.started", Kind.THREAD_STARTED), ("thread.completed", Kind.THREAD_COMPLETED),
    ("turn.started", Kind.TURN_STARTED), ("turn.completed", Kind.TURN_COMPLETED),
    ("turn.failed", Kind.TURN_FAILED), ("turn.blocked", Kind.OTHER), ("error", Kind.OTHER),
    ("item.completed", Kind.OTHER),
])
def test_lifecycle_kinds(etype, kind):
    assert parse_line(line_of({"type": etype, **VALID[etype]}))[3] is kind


def test_unknown_types_are_accepted_as_other():
    for raw in (line_of({"type": "goal.created", "goal_id": "g", "objective": 5}),
                line_of({"type": "x"}, envelope=False),
                b'{"schema_version":"0.11.0","event":{"type":"future.thing","data":[1]}}'):
        _, etype, _, kind = parse_line(raw)
        assert kind is Kind.OTHER
        assert etype in ("goal.created", "x", "future.thing")


def test_envelope_is_stored_verbatim():
    raw = b'{ "event" : {"usage":{}, "type":"turn.completed", "extra":[1, 2]} , "schema_version":"0.11.0", "x":1 }'
    line, _, event, _ = parse_line(raw)
    assert line == raw
    assert event == {"usage": {}, "type": "turn.completed", "extra": [1, 2]}


def test_bare_event_is_wrapped_with_its_bytes_kept():
    raw = b'{"type" : "turn.failed",  "message":"m\\u00e9"}'
    line, _, _, kind = parse_line(raw + b"\n")
    assert line == b'{"schema_version":"' + SCHEMA_VERSION.encode() + b'","event":' + raw + b"}"
    assert orjson.loads(line) == {"schema_version": SCHEMA_VERSION, "event": orjson.loads(raw)}
    assert kind is Kind.TURN_FAILED
    assert decode_stored(line) == (Kind.TURN_FAILED, orjson.loads(raw))


@pytest.mark.parametrize(("raw", "stored"), [
    (b'{"type":"x"}\n', b'{"type":"x"}'),
    (b'{"type":"x"}\r\n', b'{"type":"x"}'),
    (b'{"type":"x"}\r', b'{"type":"x"}'),
    (b'{"type":"x"}', b'{"type":"x"}'),
    (b'{"type":\r"x"}\r\n', b'{"type":\r"x"}'),  # a \r inside is JSON whitespace: kept
])
def test_line_endings(raw, stored):
    assert parse_line(raw)[0].endswith(stored + b"}")


@pytest.mark.parametrize(("raw", "reason"), [
    (b"", "line is blank: expected one JSON object"),
    (b"\n", "line is blank: expected one JSON object"),
    (b"\r\n", "line is blank: expected one JSON object"),
    (b"   \t", "line is blank: expected one JSON object"),
    (b'{"type":"x"}\n{"type":"y"}', "line contains a newline: append one JSON object per line"),
    (b'{"type":\n"x"}', "line contains a newline: append one JSON object per line"),
    (b'{"type":"x"}\n\n', "line contains a newline: append one JSON object per line"),
    (b'{"type":"caf\xe9"}', "line is not valid UTF-8"),
    (b"\xff\xfe", "line is not valid UTF-8"),
    (b"[1,2]", "line is not a JSON object"),
    (b'"text"', "line is not a JSON object"),
    (b"42", "line is not a JSON object"),
    (b"null", "line is not a JSON object"),
    (b'{"a":1}', 'line is neither an envelope {"schema_version","event"} nor a bare event with "type"'),
    (b'{"schema_version":1,"event":{"type":"x"}}', 'envelope: "schema_version" must be a string'),
    (b'{"event":{"type":"x"}}', 'envelope: "schema_version" must be a string'),
    (b'{"schema_version":"0.18.0"}', 'envelope: "event" must be an object'),
    (b'{"schema_version":"0.18.0","event":"turn.started"}', 'envelope: "event" must be an object'),
    (b'{"schema_version":"0.18.0","event":{}}', 'event: "type" must be a string'),
    (b'{"schema_version":"0.18.0","event":{"type":3}}', 'event: "type" must be a string'),
    (b'{"type":null}', 'event: "type" must be a string'),
])
def test_refusals(raw, reason):
    assert refusal(raw) == reason


@pytest.mark.parametrize("raw", [b"{", b'{"type":"x"} trailing', b"{'type':'x'}", b'{"type":"x",}', b"nope"])
def test_non_json_is_refused(raw):
    assert refusal(raw).startswith("line is not valid JSON: ")


# --- decode_stored: the rescan's acceptance rules -------------------------------------------


@pytest.mark.parametrize("line", [
    b"", b"   ", b"not json", b"\xff\xfe", b"[]", b"5",
    b'{"type":"turn.started"}',  # a bare event is not a stored line
    b'{"schema_version":1,"event":{"type":"x"}}',
    b'{"schema_version":"0.18.0","event":[]}',
    b'{"schema_version":"0.18.0","event":{"type":7}}',
    b'{"schema_version":"0.18.0","event":{"type":"turn.completed"}}',  # no usage
    b'{"schema_version":"0.18.0","event":{"type":"turn.completed","usage":{"input_tokens":-3}}}',
    b'{"schema_version":"0.18.0","event":{"type":"turn.failed","message":5}}',
    b'{"schema_version":"0.18.0","event":{"type":"turn.started","context":5}}',
    b'{"schema_version":"0.18.0","event":{"type":"thread.started"}}',
    b'{"schema_version":"0.18.0","event":{"type":"thread.completed","thread_id":"t"}}',
])
def test_rescan_skips(line):
    assert decode_stored(line) is None


def test_rescan_accepts_non_lifecycle_events_without_field_checks():
    line = b'{"schema_version":"0.12.0","event":{"type":"item.completed","item":5}}'
    assert decode_stored(line) == (Kind.OTHER, {"type": "item.completed", "item": 5})
    assert decode_stored(line + b"\r") == (Kind.OTHER, {"type": "item.completed", "item": 5})


@pytest.mark.parametrize("etype", sorted(VALID))
def test_rescan_accepts_what_append_stores(etype):
    line, _, event, kind = parse_line(line_of({"type": etype, **VALID[etype]}, envelope=False))
    assert decode_stored(line) == (kind, event)


# --- grounded facts (SPEC §4.1), used by the eviction summary ---------------------------------


def test_normalize_fact_collapses_whitespace_and_cuts_on_a_character_boundary():
    assert normalize_fact("  a \n\t b  ") == "a b"
    long = "é" * 400  # 800 bytes
    cut = normalize_fact(long)
    assert cut.endswith("…")
    assert len(cut.encode()) <= MAX_FACT_BYTES
    assert cut[:-1] == "é" * (509 // 2)
    exact = "x" * MAX_FACT_BYTES
    assert normalize_fact(exact) == exact


def test_event_facts():
    assert event_facts({"type": "item.completed", "item": {"type": "file_change", "changes": [
        {"path": "a.py", "kind": "add"}, {"path": "b.py", "kind": "update"}]}}) == [
        ("file_change", "file add: a.py"), ("file_change", "file update: b.py")]
    assert event_facts({"type": "item.completed", "item": {"type": "command_execution", "command": "make",
                                                           "exit_code": 2}}) == [
        ("command_execution", "ran make (exit 2)")]
    assert event_facts({"type": "turn.failed", "message": "  boom  "}) == [("turn.failed", "boom")]
    assert event_facts({"type": "item.started", "item": {"type": "agent_message", "text": "x"}}) == []
    assert event_facts({"type": "item.completed", "item": {"type": "agent_message", "text": "   "}}) == []


def test_parse_and_decode_keep_no_references():
    """Accepting, refusing (each way) and decoding many lines leaves no memory behind (no
    cache or reason kept per line)."""
    lines = [
        line_of({"type": "item.completed", "item": ITEM}),
        line_of({"type": "turn.started"}, envelope=False),  # wrapped
        line_of({"type": "item.completed", "item": {"id": "f", "type": "file_change", "status": "completed",
                                                     "changes": [{"path": "a", "kind": "nope"}]}}),
        line_of({"type": "turn.failed"}),
        line_of({"type": "turn.failed", "error": {"message": "m"}}),  # the "present" checks, each way
        line_of({"type": "turn.failed", "error": {"message": 1}}),
        line_of({"type": "item.completed", "item": {"id": "m", "type": "mcp_tool_call", "server": "s"}}),
        line_of({"type": "item.completed", "item": {"id": "m", "type": "mcp_tool_call", "tool": "t"}}),
        b'{"type":"assistant","message":{},"session_id":"s"}',  # a foreign format
        b"not json\r\n",
        b'{"schema_version":1,"event":{}}',
        b'{"schema_version":"0.18.0","event":{"type":7}}',
        line_of({"type": "thread.completed", "thread_id": 5}),  # several missing, after a wrong value
        line_of({"type": "item.completed", "item": {"id": "f", "type": "file_change", "status": "ok",
                                                     "changes": [{}]}}),  # several missing, in a list
    ]

    def churn():
        for _ in range(3000):
            for raw in lines:
                try:
                    parse_line(raw)
                except ValidationError:
                    pass
                decode_stored(raw)

    grown = bytes_kept(churn)
    assert grown < 64 * 1024, f"{grown} bytes kept after 42,000 parses"


# --- two dialects (SPEC §2) -----------------------------------------------------------------


@pytest.mark.parametrize("envelope", [True, False], ids=["envelope", "bare"])
def test_codex_turn_failed_closes_a_turn_with_its_reason(envelope):
    event = {"type": "turn.failed", "error": {"message": "stream disconnected"}}
    line, etype, decoded, kind = parse_line(line_of(event, envelope))
    assert (etype, decoded, kind) == ("turn.failed", event, Kind.TURN_FAILED)
    assert decode_stored(line) == (Kind.TURN_FAILED, event)  # a rescan reads it as a failed turn too


@pytest.mark.parametrize(("event", "reason"), [
    ({"error": {"message": 5}}, 'turn.failed: "error.message" must be a string'),
    ({"error": "boom"}, 'turn.failed: "error" must be an object with a string "message"'),
    ({"error": {"message": "x"}, "usage": 3}, 'turn.failed: "usage" must be an object'),
    ({"message": None, "error": None}, 'turn.failed: "message" must be a string (or "error" an object with '
                                       'a string "message", as Codex writes it)'),
])
def test_codex_turn_failed_refusals(event, reason):
    assert refusal(line_of({"type": "turn.failed", **event})) == reason
    assert decode_stored(line_of({"type": "turn.failed", **event})) is None  # never closes a turn


def test_codex_exec_fixture_is_accepted_whole():
    """tests/fixtures/codex_exec.jsonl: a real-shaped `codex exec --json` stream (the shapes of
    codex-rs/exec/src/exec_events.rs), written bare as Codex writes it."""
    lines = (FIXTURES / "codex_exec.jsonl").read_bytes().splitlines()
    kinds = [parse_line(line)[3] for line in lines]
    assert kinds.count(Kind.TURN_STARTED) == 2
    assert kinds.count(Kind.TURN_FAILED) == 1 and kinds.count(Kind.TURN_COMPLETED) == 1


@pytest.mark.parametrize(("line", "reason"), [
    ({"type": "system", "subtype": "init", "session_id": "s", "tools": ["Bash"], "model": "claude"},
     'Claude Code stream-json line ("type":"system"): use "memfs record --format claude" or "memfs import"'),
    ({"type": "assistant", "message": {"role": "assistant", "content": []}, "parent_tool_use_id": None,
      "session_id": "s"},
     'Claude Code stream-json line ("type":"assistant"): use "memfs record --format claude" or "memfs import"'),
    ({"type": "user", "message": {"role": "user", "content": [{"type": "tool_result"}]}},
     'Claude Code stream-json line ("type":"user"): use "memfs record --format claude" or "memfs import"'),
    ({"type": "result", "subtype": "success", "is_error": False, "result": "done", "num_turns": 2},
     'Claude Code stream-json line ("type":"result"): use "memfs record --format claude" or "memfs import"'),
    ({"type": "stream_event", "event": {"type": "content_block_delta"}, "session_id": "s", "uuid": "u"},
     'Claude Code stream-json line ("type":"stream_event"): use "memfs record --format claude" or "memfs import"'),
    ({"parentUuid": None, "isSidechain": False, "sessionId": "s", "type": "user", "uuid": "u",
      "timestamp": "2025-06-01T10:00:00Z", "message": {"role": "user", "content": "fix it"}},
     'Claude Code transcript line ("type":"user"): use "memfs import"'),
    ({"type": "summary", "summary": "Retry loop", "leafUuid": "u"},
     'Claude Code transcript line ("type":"summary"): use "memfs import"'),
    ({"timestamp": "2025-09-01T10:00:00.000Z", "type": "response_item",
      "payload": {"type": "message", "role": "user", "content": []}},
     'Codex rollout line ("type":"response_item"): use "memfs import"'),
    ({"timestamp": "2025-09-01T10:00:00.000Z", "type": "session_meta", "payload": {"id": "x"}},
     'Codex rollout line ("type":"session_meta"): use "memfs import"'),
])
def test_foreign_formats_are_refused_naming_the_format_and_the_command(line, reason):
    assert refusal(orjson.dumps(line)) == reason


@pytest.mark.parametrize("line", [
    {"type": "user"},  # unknown events of this family that merely share a word
    {"type": "result", "value": 3},
    {"type": "assistant", "message": "hi"},
    {"type": "summary", "summary": "s"},
    {"type": "event_msg", "payload": "text"},
    {"type": "item.plan.delta", "item_id": "item_1", "delta": "x"},  # Codex events memfs does not know
    {"type": "request_user_input", "id": "t", "call_id": "c", "questions": []},
    {"type": "session_meta", "id": "s"},
])
def test_unknown_events_that_are_not_foreign_formats_are_accepted(line):
    assert parse_line(orjson.dumps(line))[3] is Kind.OTHER


def test_a_foreign_event_inside_an_envelope_is_an_unknown_event():
    raw = line_of({"type": "assistant", "message": {"content": []}, "session_id": "s"})
    assert parse_line(raw)[0] == raw
