"""ProgressLedger and GoalTracker views (SPEC §4.3), through the library."""

from __future__ import annotations

import orjson
import pytest
from memfs import views
from memfs.views.progress import parse_milestones


def plan(text: str, kind: str = "item.completed") -> dict:
    return {"type": kind, "item": {"id": "p", "type": "plan", "text": text}}


STARTED = {"type": "turn.started"}


def completed(at: str | None = None) -> dict:
    event = {"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 5}}
    if at:
        event["completed_at"] = at
    return event


def failed(at: str | None = None) -> dict:
    event = {"type": "turn.failed", "message": "nope"}
    if at:
        event["completed_at"] = at
    return event


# --- ProgressLedger -------------------------------------------------------------------------


def test_milestones_from_a_plan_checklist():
    text = """Plan:
    - [x] design the API
    - [~] implement it
    - [!] get review
    - [ ] release
    * [X] star bullet done
    1. numbered step
    2) another step
    3. [x] numbered with a box
    - plain bullet is not a milestone
    - [ ]
    """
    assert [(m["id"], m["status"], m["description"]) for m in parse_milestones(text)] == [
        ("1", "done", "design the API"),
        ("2", "in_progress", "implement it"),
        ("3", "blocked", "get review"),
        ("4", "pending", "release"),
        ("5", "done", "star bullet done"),
        ("6", "pending", "numbered step"),
        ("7", "pending", "another step"),
        ("8", "done", "numbered with a box"),
    ]


def test_progress_follows_the_latest_plan_item(session):
    session.append_many([STARTED, plan("- [ ] a\n- [ ] b"), plan("- [x] a\n- [ ] b\n- [ ] c", "item.updated")])
    p = views.progress(session)
    assert [(m["description"], m["status"]) for m in p["milestones"]] == [("a", "done"), ("b", "pending"),
                                                                         ("c", "pending")]
    assert list(p) == ["session_id", "goal", "milestones", "confidence", "stalled_since", "updated_at",
                       "previous_session_id", "handoff_summary", "known_issues", "git_checkpoint"]
    assert p["session_id"] == "sess-1"
    assert p["goal"] == "a; b; c"  # no goal.created, no prompt: the plan's milestones name it
    assert (p["previous_session_id"], p["handoff_summary"], p["known_issues"], p["git_checkpoint"]) == (
        None, None, [], None)
    raw = views.render_view(session, "progress.json")
    assert raw == orjson.dumps(p) + b"\n"  # compact


def test_stall_and_advance_effects_on_confidence(session):
    session.append_many([STARTED, plan("- [ ] a\n- [ ] b\n- [ ] c"), completed("2026-01-01T00:00:00Z")])
    p = views.progress(session)
    assert p["confidence"] == 1.0 and p["stalled_since"] is None  # no milestone completed: no advance
    session.append_many([STARTED, failed("2026-01-02T00:00:00Z")])
    p = views.progress(session)
    assert p["confidence"] == 0.9 and p["stalled_since"] == "2026-01-02T00:00:00Z"
    assert p["updated_at"] == "2026-01-02T00:00:00Z"
    # a blocked turn that then fails is one stall; stalled_since keeps the first stall
    session.append_many([STARTED, {"type": "turn.blocked", "message": "wait", "completed_at": "2026-01-03T00:00:00Z"}])
    assert views.progress(session)["confidence"] == 0.8
    session.append(failed("2026-01-04T00:00:00Z"))
    p = views.progress(session)
    assert p["confidence"] == 0.8 and p["stalled_since"] == "2026-01-02T00:00:00Z"
    # a completed turn that completes a milestone is an advance: +0.05 and the stall clears
    session.append_many([STARTED, plan("- [x] a\n- [ ] b\n- [ ] c"), completed("2026-01-05T00:00:00Z")])
    p = views.progress(session)
    assert p["confidence"] == 0.85 and p["stalled_since"] is None and p["updated_at"] == "2026-01-05T00:00:00Z"
    # a failed turn that ticks a milestone is a stall, not an advance
    session.append_many([STARTED, plan("- [x] a\n- [x] b\n- [ ] c"), failed()])
    assert views.progress(session)["confidence"] == 0.75
    # an abandoned turn is neither
    session.append_many([STARTED, plan("- [x] a\n- [x] b\n- [x] c"), STARTED])
    assert views.progress(session)["confidence"] == 0.75
    session.append(completed())  # the open turn completes, but nothing new became done in it
    assert views.progress(session)["confidence"] == 0.75


def test_confidence_is_capped_and_floored(session):
    for _ in range(12):
        session.append_many([STARTED, failed()])
    assert views.progress(session)["confidence"] == 0.0
    for i in range(25):
        boxes = "\n".join(f"- [{'x' if j <= i else ' '}] m{j}" for j in range(25))
        session.append_many([STARTED, plan(boxes), completed()])
    p = views.progress(session)
    assert p["confidence"] == 1.0 and p["stalled_since"] is None


def test_stall_time_falls_back_to_the_turn_index(session):
    session.append_many([STARTED, {"type": "turn.started", "context": {"timestamp": "2026-02-02T00:00:00Z"}},
                         failed()])
    assert views.progress(session)["stalled_since"] == "2026-02-02T00:00:00Z"  # the turn's own timestamp
    session.append_many([STARTED, plan("- [ ] x")])
    ts = session.turn_index[-1]["ts"]
    assert ts and views.progress(session)["updated_at"] == ts  # no timestamp in the log: the index's


def test_progress_markdown_layout(session):
    session.append_many([
        {"type": "goal.created", "goal_id": "g1", "objective": "ship the feature"},
        STARTED, plan("- [x] design\n- [~] implement\n- [!] review\n- [ ] release"),
        failed("2026-03-01T10:00:00+00:00"),
    ])
    assert views.progress_markdown(session) == (
        "# Session Progress\n\n"
        "**Goal:** ship the feature\n"
        "**Completion:** 25%\n"
        "**Confidence:** 0.90\n"
        "**Stalled since:** 2026-03-01T10:00:00+00:00\n"
        "**Updated:** 2026-03-01T10:00:00+00:00\n\n"
        "\n## Milestones\n\n"
        "[x] 1 — design\n"
        "[~] 2 — implement\n"
        "[!] 3 — review\n"
        "[ ] 4 — release\n"
    )


def test_progress_markdown_without_milestones_and_rounding(session):
    created = session.manifest["created_at"]
    assert views.progress_markdown(session) == (
        "# Session Progress\n\n**Goal:** \n**Completion:** 100%\n**Confidence:** 1.00\n"
        f"**Updated:** {created}\n\n\n_No tracked milestones yet._\n")
    session.append(plan("\n".join(["- [x] a"] + [f"- [ ] b{i}" for i in range(7)])))  # 1/8 = 12.5% → 13%
    assert "**Completion:** 13%\n" in views.progress_markdown(session)


# --- GoalTracker ----------------------------------------------------------------------------


def goal_after(session, *events) -> dict:
    session.append_many(list(events))
    return views.goal(session)


def created(goal_id="g1", objective="ship it", **extra) -> dict:
    return {"type": "goal.created", "goal_id": goal_id, "objective": objective, **extra}


def test_goal_json_shape_without_a_goal(session):
    data = views.render_view(session, "goal.json")
    assert orjson.loads(data) == {"goal_id": None, "objective": None, "status": None, "token_budget": None,
                                  "tokens_used": 0, "created_at": None, "history": []}
    assert data == orjson.dumps(orjson.loads(data), option=orjson.OPT_INDENT_2) + b"\n"


def test_goal_created_and_tokens_used(session):
    session.append_many([STARTED, completed()])  # before the goal: not counted
    g = goal_after(session, created(token_budget=1000, created_at="2026-01-01T00:00:00Z"),
                   STARTED, completed(), STARTED, {"type": "turn.blocked", "message": "b", "usage": {"output_tokens": 7}},
                   failed())
    assert g["goal_id"] == "g1" and g["objective"] == "ship it" and g["status"] == "active"
    assert g["token_budget"] == 1000 and g["created_at"] == "2026-01-01T00:00:00Z"
    assert g["tokens_used"] == 15 + 7
    assert g["history"] == [{"event": "goal.created", "detail": "active: ship it", "offset": g["history"][0]["offset"]}]
    log = session.read_bytes()
    assert b'"goal.created"' in log[g["history"][0]["offset"]:].split(b"\n")[0]
    assert views.progress(session)["goal"] == "ship it"
    assert views.goal(session)["tokens_used"] == 22  # exceeding nothing changes the status by itself


@pytest.mark.parametrize("reason,status", [("user", "user_paused"), ("back_off", "back_off_paused"),
                                           ("no_progress", "no_progress_paused"), ("infra", "infra_paused"),
                                           ("verification", "blocked")])
def test_pause_and_resume(session, reason, status):
    g = goal_after(session, created(), {"type": "goal.paused", "reason": reason})
    assert g["status"] == status and g["history"][-1]["detail"] == f"active → {status}"
    g = goal_after(session, {"type": "goal.paused", "reason": "user"})  # pause only from active
    assert g["status"] == status and g["history"][-1]["detail"] == f"ignored: cannot pause from {status}"
    g = goal_after(session, {"type": "goal.resumed"})
    assert g["status"] == "active" and g["history"][-1]["detail"] == f"{status} → active"
    g = goal_after(session, {"type": "goal.resumed"})  # resume only from a paused status
    assert g["status"] == "active" and g["history"][-1]["detail"] == "ignored: cannot resume from active"


@pytest.mark.parametrize("paused", [False, True])
def test_complete_from_active_or_paused(session, paused):
    events = [created()] + ([{"type": "goal.paused", "reason": "infra"}] if paused else [])
    g = goal_after(session, *events, {"type": "goal.completed"})
    assert g["status"] == "complete"
    for ignored in ({"type": "goal.paused", "reason": "user"}, {"type": "goal.resumed"},
                    {"type": "goal.completed"}, {"type": "goal.budget_exceeded"}):
        g = goal_after(session, ignored)
        assert g["status"] == "complete" and g["history"][-1]["detail"].startswith("ignored: ")


@pytest.mark.parametrize("paused", [False, True])
def test_budget_exceeded_from_active_or_paused(session, paused):
    events = [created(token_budget=10)] + ([{"type": "goal.paused", "reason": "back_off"}] if paused else [])
    g = goal_after(session, *events, {"type": "goal.budget_exceeded"})
    assert g["status"] == "budget_limited"
    for ignored in ({"type": "goal.resumed"}, {"type": "goal.paused", "reason": "user"},
                    {"type": "goal.budget_exceeded"}, {"type": "goal.completed"}):
        g = goal_after(session, ignored)
        assert g["status"] == "budget_limited" and g["history"][-1]["detail"].startswith("ignored: ")


def test_new_goal_replaces_and_clear(session):
    g = goal_after(session, created(token_budget=5), STARTED, completed(), {"type": "goal.completed"},
                   created("g2", "second objective"))
    assert (g["goal_id"], g["objective"], g["status"], g["token_budget"], g["tokens_used"]) == (
        "g2", "second objective", "active", None, 0)
    assert g["history"][-1]["detail"] == "active: second objective (replaces g1)"
    assert g["created_at"] == session.manifest["created_at"]  # no time in the log outside a turn
    g = goal_after(session, {"type": "goal.cleared"})
    assert {k: g[k] for k in ("goal_id", "objective", "status", "token_budget", "tokens_used", "created_at")} == {
        "goal_id": None, "objective": None, "status": None, "token_budget": None, "tokens_used": 0,
        "created_at": None}
    assert g["history"][-1]["detail"] == "active → cleared"
    assert views.progress(session)["goal"] == ""
    g = goal_after(session, {"type": "goal.cleared"}, {"type": "goal.resumed"})
    assert [h["detail"] for h in g["history"][-2:]] == ["ignored: no goal", "ignored: no goal"]


def test_ignored_goal_events(session):
    g = goal_after(session,
                   {"type": "goal.paused", "reason": "user"},  # no goal yet
                   {"type": "goal.created", "goal_id": "g1"},  # no objective
                   created(token_budget=-3),
                   {"type": "goal.paused", "reason": "lunch"},  # unknown reason
                   {"type": "goal.paused", "reason": "user", "goal_id": "other"},  # not the current goal
                   {"type": "goal.renamed"})  # unknown goal event
    assert g["status"] == "active" and g["token_budget"] is None
    assert [(h["event"], h["detail"]) for h in g["history"]] == [
        ("goal.paused", "ignored: no goal"),
        ("goal.created", "ignored: goal_id and objective must be strings"),
        ("goal.created", "active: ship it"),
        ("goal.paused", "ignored: unknown pause reason 'lunch'"),
        ("goal.paused", "ignored: goal 'other' is not the current goal"),
        ("goal.renamed", "ignored: unknown goal event"),
    ]
    offsets = [h["offset"] for h in g["history"]]
    assert offsets == sorted(offsets) and len(set(offsets)) == 6


def test_a_plan_item_timestamp_dates_the_update(session):
    session.append_many([STARTED, {"type": "item.completed", "item": {
        "id": "p", "type": "plan", "text": "- [ ] a", "context": {"timestamp": "2026-04-04T00:00:00Z"}}}])
    assert views.progress(session)["updated_at"] == "2026-04-04T00:00:00Z"


# --- Codex's todo_list and the goal's fallbacks (SPEC §4.3) ---------------------------------


def todos(*entries: tuple[str, bool], kind: str = "item.updated") -> dict:
    return {"type": kind, "item": {"id": "item_1", "type": "todo_list",
                                   "items": [{"text": t, "completed": c} for t, c in entries]}}


def test_a_todo_list_drives_the_milestones_and_the_latest_of_plan_or_todo_wins(session):
    session.append_many([STARTED, plan("Fix the retry loop\n- [x] read\n- [ ] fix"),
                         todos(("Read src/net.py", True), ("Add a retry loop", False), ("Run the tests", False))])
    p = views.progress(session)
    assert [(m["id"], m["description"], m["status"]) for m in p["milestones"]] == [
        ("1", "Read src/net.py", "done"), ("2", "Add a retry loop", "pending"), ("3", "Run the tests", "pending")]
    assert p["goal"] == "Read src/net.py; Add a retry loop; Run the tests"
    md = views.progress_markdown(session)
    assert "**Completion:** 33%" in md and "[x] 1 — Read src/net.py\n[ ] 2 — Add a retry loop\n" in md
    session.append_many([todos(("Read src/net.py", True), ("Add a retry loop", True), ("Run the tests", False)),
                         completed()])
    assert views.progress(session)["confidence"] == 1.0 and "**Completion:** 67%" in views.progress_markdown(session)
    session.append_many([STARTED, plan("Fix the retry loop\n- [x] read\n- [ ] fix")])  # a later plan wins
    p = views.progress(session)
    assert [m["description"] for m in p["milestones"]] == ["read", "fix"] and p["goal"] == "Fix the retry loop"


def test_a_todo_list_turn_that_completes_an_entry_advances_and_a_failed_turn_stalls(session):
    session.append_many([STARTED, todos(("a", False), ("b", False)), failed()])
    p = views.progress(session)
    assert p["confidence"] == 0.9 and p["stalled_since"] is not None
    session.append_many([STARTED, todos(("a", True), ("b", False)), completed()])
    p = views.progress(session)
    assert p["confidence"] == 0.95 and p["stalled_since"] is None


def test_goal_falls_back_to_the_latest_turns_first_prompt(session):
    prompt = lambda text: {"type": "item.completed", "item": {"id": "u", "type": "user_message", "text": text}}  # noqa: E731
    session.append_many([STARTED, plan("- [ ] a"), prompt("Make fetch() retry"), prompt("also add jitter"),
                         completed()])
    assert views.progress(session)["goal"] == "Make fetch() retry"
    session.append_many([STARTED, {"type": "item.completed", "item": {
        "id": "u2", "type": "user_message", "content": [{"type": "text", "text": "Now document it"}]}}])
    assert views.progress(session)["goal"] == "Now document it"
    session.append_many([{"type": "goal.created", "goal_id": "g", "objective": "ship it"}])
    assert views.progress(session)["goal"] == "ship it"  # a named goal always wins
