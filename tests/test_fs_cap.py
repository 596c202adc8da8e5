"""The amortized cap through a mount (SPEC §3.7): ``-o evict_to=`` / ``--evict-to`` set how far
an eviction goes; a user appending turn after turn with the shell sees the counts, the turn
ordinals and the eviction summaries the spec gives."""

from __future__ import annotations

import json

import pytest

from mounting import event, mounted, needs_fuse, sh

pytestmark = needs_fuse

START = event("turn.started")
DONE = event("turn.completed", usage={"input_tokens": 1})


def message(text: str) -> str:
    return event("item.completed", item={"id": text, "type": "agent_message", "text": text})


# 30 turns of 4 events (120) at a cap of 40; the 41st event is turn 11's first.
# * 0.9 (the default): down to 36 takes two turns (to 33); the next rewrite comes two turns
#   later: turns 11, 13, ..., 29 → 10 rewrites of 8 events; turns 21-30 remain.
# * 1.0: one turn goes at the first event of every turn from 11 on → 20 rewrites of 4.
# * 0.5: down to 20 takes six turns (to 17); turns 11, 17, 23, 29 → 4 rewrites of 24;
#   turns 25-30 remain.
CASES = {"": ([8] * 10, 21), "-o evict_to=1.0": ([4] * 20, 21), "--evict-to 0.5": ([24] * 4, 25)}


@pytest.mark.parametrize("option", list(CASES), ids=["default-0.9", "o-evict_to-1.0", "flag-0.5"])
def test_a_shell_user_sees_the_amortized_cap(tmp_path, option):
    sizes, base = CASES[option]
    with mounted(tmp_path / "store", tmp_path / "mnt", "--max-events", "40", *option.split()) as m:
        s = m.mnt / "sessions" / "s"
        s.mkdir()
        for t in range(1, 31):
            lines = " ".join(f"'{x}'" for x in (START, message(f"t{t} a"), message(f"t{t} b"), DONE))
            sh(f"printf '%s\\n' {lines} >> events.jsonl", s)  # one write of a whole turn
        manifest = json.loads((s / "manifest.json").read_text())
        turns = json.loads((s / "index" / "turns.json").read_text())["entries"]
        names = sorted(p.name for p in (s / "derived").iterdir() if p.name.startswith("eviction-summary-"))
        evicted = [json.loads((s / "derived" / name).read_text())["evicted_event_count"] for name in names]
        log = (s / "events.jsonl").read_text().splitlines()
        first = sh(f"cat derived/turns/{base}.jsonl", s).stdout.splitlines()
        gone = sh(f"cat derived/turns/{base - 1}.jsonl", s, check=False)
    assert (manifest["turn_count"], manifest["event_count"], manifest["retained_turn_base"]) == (30, len(log), base)
    assert [e["turn_number"] for e in turns] == list(range(base, 31))
    assert len(log) == 4 * (31 - base)
    assert evicted == sizes  # one summary per rewrite, each of a whole number of turns
    assert sum(evicted) + len(log) == 120  # every line is in the log or counted in a summary
    assert [json.loads(x).get("event", {}).get("item", {}).get("text") for x in first][1:3] == \
        [f"t{base} a", f"t{base} b"]  # an ordinal still names its own turn
    assert gone.returncode != 0 and "No such file" in gone.stderr
