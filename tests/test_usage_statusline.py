"""``memfs statusline`` (Claude Code's statusLine JSON in, one line out) and the default
configuration file ``$XDG_CONFIG_HOME/memfs/config.toml`` with ``memfs config path|show`` (SPEC §12).

Numbers by hand: gpt-5 at $1.25 input per million tokens; acme-1 has no price.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

from agent_helpers import MEMFS
from test_usage import native
from test_usage_reports import turn


def memfs(*args: str, stdin: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*MEMFS, *args], input=stdin, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def stamp(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def test_statusline_prints_model_session_today_block_and_context(tmp_path):
    store = tmp_path / "store"
    now = int(time.time())
    midnight = int(time.mktime(time.localtime(now)[:3] + (0, 0, 0, 0, 0, -1)))
    first = max(now - 20 * 60, midnight)  # (the turns within today, also just after midnight)
    native(store, "sess-1", *turn(stamp(first), "gpt-5", input_tokens=800_000))  # $1.00
    native(store, "other", *turn(stamp(first + (now - first) // 2), "gpt-5", input_tokens=400_000),  # $0.50
           *turn(stamp(first + (now - first) * 3 // 4), "acme-1", input_tokens=10))  # no price: today's cost is the priced part
    stdin = json.dumps({"session_id": "sess-1", "transcript_path": str(tmp_path / "none.jsonl"),
                        "model": {"id": "claude-opus-4-6", "display_name": "Opus"},
                        "workspace": {"current_dir": str(tmp_path)}, "cost": {"total_cost_usd": 0.25},
                        "context_window": {"context_window_size": 200_000,
                                           "current_usage": {"input_tokens": 10, "cache_creation_input_tokens": 990,
                                                             "cache_read_input_tokens": 49_000,
                                                             "output_tokens": 7}}})
    proc = memfs("statusline", "--store", str(store), stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    start = first - first % 3600  # the block: from the hour floor of the first turn
    m = re.fullmatch(r"Opus \| session \$1\.00 \| today \$1\.50\* \| block \$1\.50\*, (\d+)h(\d\d)m left \| "
                     r"ctx 50,000 \(25%\)\n", proc.stdout)
    assert m, proc.stdout
    left = int(m.group(1)) * 60 + int(m.group(2))
    assert 0 <= (start + 5 * 3600 - now) // 60 - left <= 2
    assert (store / ".memfs" / "catalog.sqlite").exists()
    assert (store / ".memfs" / "usage-recent.sqlite").exists()  # the next redraw reads the summary alone
    again = memfs("statusline", "--store", str(store), stdin=stdin)
    assert again.stdout.split(" | ")[:3] == proc.stdout.split(" | ")[:3]
    # a conversation the store does not hold: Claude Code's own cost; the context from the transcript's tail
    transcript = tmp_path / "t.jsonl"
    transcript.write_text("\n".join(json.dumps(line) for line in (
        {"type": "assistant", "message": {"usage": {"input_tokens": 5, "cache_read_input_tokens": 100}}},
        {"type": "user", "message": {"content": "next"}},
        {"type": "assistant", "message": {"usage": {"input_tokens": 3, "cache_read_input_tokens": 1_200,
                                                    "cache_creation_input_tokens": 300, "output_tokens": 9}}},
    )) + "\n")
    other = memfs("statusline", "--store", str(store),
                  stdin=json.dumps({"session_id": "elsewhere", "transcript_path": str(transcript),
                                    "model": {"display_name": "Sonnet"}, "cost": {"total_cost_usd": 0.25}}))
    assert other.stdout.startswith("Sonnet | session $0.25 (claude) | today $1.50* | block $1.50*, ")
    assert other.stdout.endswith(" | ctx 1,503\n")
    # no store at all: the line from stdin alone
    bare = memfs("statusline", "--store", str(tmp_path / "absent"), stdin='{"model": {"display_name": "Opus"}}')
    assert bare.returncode == 0 and bare.stdout == "Opus | session - | today $0.00 | no active block\n"
    # a turn appended to this session, then a new session: each shows at the next redraw
    native(store, "sess-1", *turn(stamp(max(now - 60, first)), "gpt-5", input_tokens=400_000))  # $0.50
    assert memfs("statusline", "--store", str(store), stdin=stdin).stdout.split(" | ")[1:3] == \
        ["session $1.50", "today $2.00*"]
    native(store, "third", *turn(stamp(max(now - 30, first)), "gpt-5", input_tokens=800_000))  # $1.00
    assert memfs("statusline", "--store", str(store), stdin=stdin).stdout.split(" | ")[1:3] == \
        ["session $1.50", "today $3.00*"]


def test_the_default_config_file_is_read_when_no_config_is_given(tmp_path):
    store = tmp_path / "store"
    native(store, "s", *turn("2026-12-01T10:00:00Z", "acme-1", input_tokens=1_000_000))
    xdg = tmp_path / "xdg"
    (xdg / "memfs").mkdir(parents=True)
    config = xdg / "memfs" / "config.toml"
    config.write_text('store = "../../store"\n[prices."acme-1"]\ninput = 2.0\n')  # relative to the file
    env = {"XDG_CONFIG_HOME": str(xdg)}
    doc = json.loads(memfs("usage", "--json", "--tz", "UTC", env=env).stdout)
    assert doc["totals"]["totalCost"] == 2.0 and doc["totals"]["cost_usd"] == 2.0  # its store and its prices
    assert memfs("config", "path", env=env).stdout == f"{config}\n"
    shown = json.loads(memfs("config", "show", "--json", env=env).stdout)
    assert shown["file"] == str(config) and Path(shown["sessions_root"]).resolve() == store.resolve()
    assert shown["prices"] == {"acme-1": {"input": 2.0}}
    # --config wins over the default file; without either file, the built-in defaults
    other = tmp_path / "other.toml"
    other.write_text(f'store = "{store}"\n')
    unpriced = json.loads(memfs("usage", "--json", "--config", str(other), env=env).stdout)
    assert unpriced["totals"]["cost_usd"] is None
    empty = {"XDG_CONFIG_HOME": str(tmp_path / "nothing")}
    assert memfs("config", "path", env=empty).stdout == (
        f"{tmp_path / 'nothing' / 'memfs' / 'config.toml'} (absent: the built-in defaults apply)\n")
    bad = xdg / "memfs" / "config.toml"
    bad.write_text('[prices."m"]\ninput = 1e308\n')
    proc = memfs("usage", "--store", str(store), env=env)
    assert proc.returncode == 1 and "prices.'m'.input 1e+308 is too large" in proc.stderr
