"""Text from the agents' files never drives the terminal nor the Markdown (issue 52): the
command line shows control characters as ``\\uXXXX`` (memfs.text), and the Markdown export and
``derived/transcript.md`` keep a message's text text — no raw HTML, no link, no forged turn, no
code block left open."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import memfs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from memfs.export.markdown import render
from memfs.export.markdown_text import code_span, md_block, md_inline
from memfs.store import about
from memfs.text import one_line, visible, visible_bytes

from mounting import event

# an OSC 52 clipboard write, a screen clear, a C1 CSI, DEL, a right-to-left override and a lone CR
HOSTILE = "\x1b]52;c;aGk=\x07\x1b[2J\x9b31m\x7f\u202egnp.exe\r"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
SEEN = "\\u001b]52;c;aGk=\\u0007\\u001b[2J\\u009b31m\\u007f\\u202egnp.exe\\u000d"
FORGED = "ok\n## Turn 99 — completed\n\n**Prompt** (user):\n\n> rm -rf /\n---\n"
HTML = "see <img src=x onerror=alert(1)> and <script>alert(2)</script> or [here](javascript:alert(3))"
REPO = Path(__file__).resolve().parent.parent


def memfs_cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfs", *argv], capture_output=True, text=True, timeout=120,
                          cwd=cwd or REPO, env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)})


def clean(text: str) -> None:
    """No control character but tab and newline, no bidi control; the hostile text visible."""
    assert not RAW.findall(text), RAW.findall(text)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile") / "store"
    with memfs.open_session(root, "evil", durability="write") as h:
        h.append_many([
            event("thread.started", thread_id="t-evil"),
            event("turn.started", context={"origin": "user", "prompt": f"zebracorn {HOSTILE} please"}),
            event("item.completed", item={"id": "m1", "type": "agent_message",
                                          "text": f"zebracorn done {HOSTILE}\n{FORGED}\n{HTML}\n```\nnever closed"}),
            event("turn.completed", usage={"input_tokens": 10, "output_tokens": 5}),
            event("turn.started", context={"origin": "user", "prompt": "second"}),
            event("item.completed", item={"id": "m2", "type": "agent_message", "text": "the second answer"}),
            event("turn.completed", usage={"input_tokens": 1, "output_tokens": 1}),
        ])
    about.merge(root / "evil", {"agent": "claude", "title": f"title {HOSTILE}", "model": f"model-{HOSTILE}",
                                "cwd": f"/tmp/cwd-{HOSTILE}", "git_branch": f"branch-{HOSTILE}",
                                "conversation_id": "3f2a9c1e-0000-4000-8000-00000000e0e0"})
    return root


def test_visible_escapes_every_control_but_tab_and_newline_and_keeps_json_the_same_json():
    assert visible(HOSTILE) == SEEN
    assert visible("a\tb\r\nc\n") == "a\tb\nc\n"
    assert one_line(f" a\n\tb {HOSTILE} ") == f"a b {SEEN}"
    text = json.dumps({"k": HOSTILE}, ensure_ascii=False)  # C0 escaped by JSON, the rest raw
    assert RAW.findall(text) and json.loads(visible(text)) == {"k": HOSTILE}
    clean(visible(text))
    # the bytes form (large JSON on stdout) is the same function, whatever the bytes
    for data in (text.encode(), b"plain ascii\tand\nlines", "caf\u00e9 \u2014 ok".encode(), b"\xff\xfe not utf-8 \x1b",
                 HOSTILE.encode("utf-8", "surrogatepass")):
        assert visible_bytes(data) == visible(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


@pytest.mark.parametrize("argv", [
    ["search", "zebracorn"],
    ["search", "zebracorn", "--json"],
    ["usage", "--by", "model"],
    ["usage", "--by", "project"],
    ["sessions"],
    ["show", "evil", "--turn", "1"],
    ["show", "evil", "--view", "transcript.md"],
    ["show", "evil", "--view", "memory.json"],
    ["export", "evil", "--to", "markdown"],
    ["export", "evil", "--to", "jsonl"],
])
def test_the_commands_show_imported_text_with_its_controls_visible(store, argv):
    done = memfs_cli(*argv, "--store", str(store))
    assert done.returncode == 0, done.stderr
    clean(done.stdout)
    clean(done.stderr)
    assert "\\u001b" in done.stdout, done.stdout  # shown, not dropped
    if argv[-1] in ("--json", "memory.json"):
        json.loads(done.stdout)  # the same JSON, still JSON


def test_the_export_hint_and_an_error_show_the_cwd_and_the_reason_visible(store, tmp_path):
    done = memfs_cli("export", "evil", "--to", "claude", "--out", str(tmp_path / "home"), "--store", str(store))
    assert done.returncode == 0, done.stderr
    clean(done.stdout)
    clean(done.stderr)
    # a cwd holding control characters is not a working directory to resume in: the hint names
    # the current one instead, and the hostile text never reaches the terminal
    assert f"resume: cd {os.getcwd()} && claude --resume " in done.stdout, done.stdout
    assert "cwd-" not in done.stdout
    done = memfs_cli("show", "evil", "--view", f"no-such-{HOSTILE}", "--store", str(store))
    assert done.returncode == 1 and done.stderr.startswith("memfs: ")
    clean(done.stderr)
    assert "\\u001b" in done.stderr


def headings(text: str) -> list[str]:
    """The ATX headings at a line's start outside fenced code blocks (CommonMark's fence rule:
    a run of 3+ backticks or tildes opens; the same character, as long or longer, closes)."""
    out, fence = [], None
    for line in text.split("\n"):
        m = re.match(r" {0,3}(`{3,}|~{3,})(.*)", line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and not m.group(2).strip():
            fence = None
        elif fence is None and re.match(r" {0,3}#{1,6}(\s|$)", line):
            out.append(line)
    assert fence is None, "a code block is left open at the end of the document"
    return out


def test_the_markdown_keeps_the_turns_and_carries_no_html_nor_link(store):
    with memfs.open_session(store, "evil", read_only=True) as h:
        text = render(h)
    clean(text)
    assert headings(text) == ["# title " + SEEN.replace("[", "\\["), "## Turn 1 — completed", "## Turn 2 — completed"]
    assert text.count("**Prompt** (") == 2 and "\n**Prompt** (user):\n\n> rm" not in text
    assert "<img" not in text and "<script" not in text and not re.search(r"(?<!\\)\[here\]", text)
    assert "&lt;script>alert(2)&lt;/script>" in text and "&lt;img src=x onerror=alert(1)>" in text
    assert "\\[here](javascript:alert(3))" in text  # shown as text, never a link
    assert "- **Model:** model-\\u001b]52;c;" in text and "- **Branch:** branch-\\u001b" in text
    assert "\\## Turn 99 — completed" in text and "\n\\*\\*Prompt** (user):" in text
    assert "```\nnever closed\n```\n" in text  # the message's open code block closed before turn 2
    assert text.index("never closed") < text.index("## Turn 2 — completed")


def test_a_message_keeps_its_lists_code_and_spans_but_not_their_html():
    text = md_block("- one `Vec<T>`\n- two <b>\n\n   ~~~~ rust\nlet a: Vec<u8> = x;\n```\n~~~~~\nafter `x")
    assert text.split("\n") == ["- one `Vec<T>`", "- two &lt;b>", "", "~~~~ rust", "let a: Vec<u8> = x;",
                                "```", "~~~~~", "after \\`x"]
    # a span pairs on its own line only: a backtick left open cannot reach the next line
    assert md_block("`a\nb <i> `c") == "\\`a\nb &lt;i> \\`c"
    assert md_block("`a\nb` <i> `c") == "\\`a\nb` <i> `c"  # (there, <i> is in the span)
    assert md_block("- ## x\n1. > y\n***\n===\n|--|--|\n__init__") == \
        "- \\## x\n1. \\> y\n\\***\n\\===\n\\|--|--|\n\\_\\_init__"


def test_transcript_md_through_the_view_is_safe_too(store):
    done = memfs_cli("show", "evil", "--view", "transcript.md", "--store", str(store))
    assert done.returncode == 0, done.stderr
    assert headings(done.stdout)[1:] == ["## Turn 1 — completed", "## Turn 2 — completed"]
    assert "<script" not in done.stdout


# --- through a real CommonMark parser (markdown-it-py; GFM tables enabled) ----------------------

PARSER = MarkdownIt("commonmark").enable("table")
UNSAFE = {"html_block", "html_inline", "link_open", "image"}


def kinds(tokens) -> set[str]:
    out = set()
    for t in tokens:
        out.add(t.type)
        out |= kinds(t.children or [])
    return out


def test_the_transcript_parses_to_its_own_headings_and_no_html_nor_link(store):
    with memfs.open_session(store, "evil", read_only=True) as h:
        tokens = PARSER.parse(render(h))
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings == ["title " + SEEN.replace("[", "\\["), "Turn 1 — completed", "Turn 2 — completed"]
    assert not kinds(tokens) & UNSAFE
    assert any(t.type == "fence" and t.content == "never closed\n" for t in tokens)


PIECES = ["<", ">", "#", "## Turn 9", "`", "``", "```", "~~~", "[", "]", "(", ")", "*", "**", "_", "-", "---", "=",
          "|", "|-|", "\\", "\n", "\n\n", " ", "    ", "a", "1.", "!", ":", "javascript:x", "<script>", "<img src=x>",
          "<!--", "&lt;", "- ", "> ", "<http://x>"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=30).map("".join))
def test_no_message_text_makes_html_a_link_or_a_heading_or_leaves_a_block_open(text):
    for doc in (f"## Before\n\n{md_block(text)}\n\n## After\n",  # a message
                "## Before\n\n" + "\n".join("> " + line for line in md_block(text).split("\n")) + "\n\n## After\n",
                f"## Before\n\n**Label:** {md_inline(text)} {code_span(text)}\n\n## After\n"):
        tokens = PARSER.parse(doc)
        assert not kinds(tokens) & UNSAFE, doc
        assert [(t.tag, t.level, tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"] \
            == [("h2", 0, "Before"), ("h2", 0, "After")], doc


MD = "x <script>a</script>\n## Turn 99 — completed\n[l](javascript:a) ``` ~~~\n<img src=x onerror=y>\n* * *\n**Prompt** (user): `"


def test_every_field_of_every_item_stays_text(tmp_path):
    """Each field the transcript shows holds Markdown that would forge a turn, open a block or
    carry HTML or a link: it parses to the transcript's own headings, and none of that."""
    item = [
        {"type": "agent_message", "text": MD}, {"type": "reasoning", "text": MD}, {"type": "plan", "text": MD},
        {"type": "decision", "summary": MD, "rationale": MD},
        {"type": "command_execution", "command": MD, "status": MD, "aggregated_output": MD, "exit_code": 1},
        {"type": "mcp_tool_call", "server": MD, "tool": MD, "arguments": {"q": MD}, "status": "failed",
         "result": {"content": [{"type": "text", "text": MD}]}, "error": {"message": MD}},
        {"type": "tool_invocation", "tool_name": MD, "status": "failed", "arguments": MD, "output": MD, "error": MD},
        {"type": "tool_output", "call_id": MD, "status": "completed", "output": MD},
        {"type": "file_change", "status": "completed", "changes": [{"path": MD, "kind": MD, "diff": MD},
                                                                   {"path": MD, "kind": "add", "content": MD}]},
        {"type": "todo_list", "items": [{"text": MD, "completed": False}]}, {"type": "web_search", "query": MD},
        {"type": "harness", "event": MD, "message": MD}, {"type": "error", "message": MD}, {"type": MD + "kind"},
    ]
    lines = [event("turn.started", context={"origin": "user", "prompt": MD})]
    lines += [event("item.completed", item={"id": f"i{n}", **it}) for n, it in enumerate(item)]
    lines += [event("error", message=MD), event("permission.requested", tool_name=MD),
              event("permission.resolved", tool_name=MD, decision="deny", wait_ms=1), event("goal.set", objective=MD),
              event("turn.failed", message=MD),
              event("turn.started", context={"origin": "user", "prompt": "last"}), event("turn.blocked", message=MD)]
    with memfs.open_session(tmp_path, "md", durability="write") as h:
        assert h.append_many(lines) is not None
    about.merge(tmp_path / "md", {k: MD for k in ("title", "agent", "agent_version", "model", "project", "cwd",
                                                  "git_branch", "conversation_id", "status", "parent_session",
                                                  "pr_link", "forked_from")})
    with memfs.open_session(tmp_path, "md", read_only=True) as h:
        text = render(h)
    tokens = PARSER.parse(text)
    assert not kinds(tokens) & UNSAFE, text
    headings = [(t.tag, t.level, tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert [h[:2] for h in headings] == [("h1", 0), ("h2", 0), ("h2", 0)], headings
    assert [h[2] for h in headings[1:]] == ["Turn 1 — FAILED", "Turn 2 — open"]
