"""Properties of the event contract over random lines (hypothesis), built from the names and
values of memfs.events' own tables, most of them near a valid event of a known type with fields
wrong or missing at any depth: ``parse_line`` accepts or refuses with a ValidationError and a
one-line reason, never anything else; the rescan (``decode_stored``) accepts every line append
stores, as the same event and kind, and never raises."""

from __future__ import annotations

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from memfs import events
from memfs.errors import ValidationError


def _names_and_values(check, names: set, values: set) -> None:
    """Every field name and enumerated value the tables mention."""
    kind = check[0]
    if kind == "fields":
        for name, _required, sub, _missing in check[2]:
            names.add(name)
            _names_and_values(sub, names, values)
    elif kind == "list_of":
        _names_and_values(check[2], names, values)
    elif kind == "by":
        names.add(check[2])
        values.update(check[3])
        for sub in (*check[3].values(), check[4]):
            _names_and_values(sub, names, values)
    elif kind == "present":
        for key, sub in check[2]:
            names.add(key)
            _names_and_values(sub, names, values)
        _names_and_values(check[3], names, values)
    elif kind == "one_of":
        values.update(check[2])
    elif kind == "equal":
        values.add(check[2])


NAMES: set = {"type", "event", "schema_version", "payload", "message", "subtype", "session_id", "parentUuid"}
VALUES: set = {"", "x", events.SCHEMA_VERSION, "system", "assistant", "session_meta", "summary"}
for _check in events.EVENT_FIELDS.values():
    _names_and_values(_check, NAMES, VALUES)
VALUES |= set(events.EVENT_FIELDS)
NAMES, VALUES = sorted(NAMES), sorted(VALUES)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=False),
                    st.sampled_from(VALUES), st.text(max_size=4))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(NAMES), inner, max_size=6)),
    max_leaves=24)
event_types = st.one_of(st.sampled_from(sorted(events.EVENT_FIELDS)), st.sampled_from(VALUES), values)


GOOD = {"str": st.sampled_from(VALUES), "bool": st.booleans(), "int": st.integers(-3, 3),
        "uint": st.integers(0, 3), "number": st.one_of(st.integers(0, 3), st.floats(0, 1)),
        "object": st.dictionaries(st.sampled_from(NAMES), scalars, max_size=2), "any": values,
        "str_list": st.lists(st.sampled_from(VALUES), max_size=2)}


def near(draw, check):
    """A value for ``check``: mostly one that passes, sometimes any value (a wrong one, or a
    missing or extra field), at every depth."""
    if draw(st.integers(0, 11)) == 5:  # (not 0: hypothesis favours the bounds)
        return draw(values)
    kind = check[0]
    if kind in GOOD:
        return draw(GOOD[kind])
    if kind == "one_of":
        return draw(st.sampled_from(sorted(check[2])))
    if kind == "equal":
        return check[2]
    if kind == "list_of":
        return [near(draw, check[2]) for _ in range(draw(st.integers(0, 2)))]
    if kind == "by":
        selector = draw(st.sampled_from(sorted(check[3])))
        obj = near(draw, check[3][selector])
        if type(obj) is dict:
            obj[check[2]] = selector
        return obj
    if kind == "present":
        return near(draw, draw(st.sampled_from([case for _key, case in check[2]] + [check[3]])))
    obj = {}  # fields
    for name, required, sub, _missing in check[2]:
        if draw(st.integers(0, 9)) < (9 if required else 4):
            obj[name] = None if not required and draw(st.integers(0, 9)) == 3 else near(draw, sub)
    if draw(st.integers(0, 5)) == 2:
        obj[draw(st.sampled_from(NAMES))] = draw(values)
    return obj


@st.composite
def lines(draw) -> bytes:
    """A line as an agent might write it: an envelope or a bare event (or neither), mostly of
    a known type with its fields, some of them wrong or missing at any depth."""
    if draw(st.integers(0, 3)) != 1:
        etype = draw(st.sampled_from(sorted(events.EVENT_FIELDS)))
        event = near(draw, events.EVENT_FIELDS[etype])
        if type(event) is dict and draw(st.integers(0, 9)) != 4:
            event["type"] = etype
    else:
        event = draw(st.dictionaries(st.sampled_from(NAMES), values, max_size=8))
        if draw(st.booleans()):
            event["type"] = draw(event_types)
    shape = draw(st.sampled_from(("envelope", "envelope", "bare", "bare", "odd envelope", "anything")))
    if shape == "envelope":
        obj = {"schema_version": events.SCHEMA_VERSION, "event": event}
    elif shape == "odd envelope":
        obj = {"schema_version": draw(values), "event": draw(st.one_of(st.just(event), values))}
    elif shape == "anything":
        obj = draw(values)
    else:
        obj = event
    raw = orjson.dumps(obj)
    ending = draw(st.sampled_from((b"", b"\n", b"\r\n", b"", b"\n", b"", b"\n", b"\r", b" ", b"\n\n")))
    if draw(st.integers(0, 19)) == 7:  # damage: a byte changed, or a newline inside
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.sampled_from((b"\n", b"\xff", b"}", b'"', b""))) + raw[at + 1:]
    return raw + ending


def check_line(raw: bytes) -> None:
    try:
        stored, etype, event, kind = events.parse_line(raw)
    except ValidationError as exc:
        reason = str(exc)
        assert reason and "\n" not in reason, repr(reason)
        events.decode_stored(raw)  # never raises
        return
    assert type(stored) is bytes and 10 not in stored
    assert kind == events.LIFECYCLE_KINDS.get(etype, events.Kind.OTHER)
    assert events.decode_stored(stored) == (kind, event)  # the rescan keeps what append stored


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines())
@example(b'{"type":"thread.completed","thread_id":5}')
@example(b'{"type":"item.completed","item":{"id":"f","type":"file_change","status":"ok","changes":[{}]}}')
@example(b'{"type":"item.completed","item":{"id":"m","type":"mcp_tool_call","server":"s"}}')
@example(b'{"type":"turn.failed","error":{"message":1}}\r\n')
@example(b'{"type":"turn.failed","message":null,"error":{"message":"m"}}')
@example(b'{"type":"assistant","message":{},"session_id":"s"}')
@example(b"\xff\n")
def test_a_line_is_stored_as_the_rescan_reads_it_or_refused_with_one_reason(raw):
    check_line(raw)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40))
def test_arbitrary_bytes_are_refused_with_a_reason_never_an_error(raw):
    check_line(raw)
