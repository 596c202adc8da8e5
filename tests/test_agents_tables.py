"""One folder per agent (issue 53): each agent's table is read and written by the same names,
patterns and token fields, and the registry finds the folders. Unit tests, no mount."""

from __future__ import annotations

from pathlib import Path

import memfs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from memfs import agents
from memfs.agents import common
from memfs.ingest import make_translator, translators

FOLDERS = sorted(p.name for p in (Path(memfs.__file__).parent / "agents").iterdir()
                 if p.is_dir() and (p / "__init__.py").exists())
COUNT = st.integers(min_value=0, max_value=2**40)


def test_the_registry_lists_every_folder_and_what_each_provides():
    assert list(agents.AGENTS) == FOLDERS == ["claude", "codex", "gemini", "opencode"]
    for name in agents.AGENTS:
        table = agents.shapes(name)
        assert table is not None and table.name == name
        assert agents.reader(name) is not None and agents.reader(name).TRANSLATORS
    assert agents.writers() == ("claude", "codex", "opencode")  # no Gemini writer (yet)
    assert agents.writer("gemini") is None and agents.shapes("vtcode") is None and agents.writer("nobody") is None


def test_every_translator_kind_comes_from_a_folder():
    assert set(translators()) == {"native", "rollout", "claude", "gemini", "opencode"}
    for kind in translators():
        assert make_translator(kind).kind == kind


@pytest.mark.parametrize("name", ["claude", "codex", "opencode"])
def test_a_tool_name_an_export_writes_reads_back_as_the_same_kind(name):
    table = agents.shapes(name)
    assert table is not None and table.writes
    for kind, tool in table.writes.items():
        assert common.kind_of(table, tool) == kind.partition(".")[0]


@pytest.mark.parametrize("name", ["claude", "codex"])
@given(code=st.integers(min_value=0, max_value=999_999_999), output=st.text(max_size=40))
def test_an_exit_code_written_in_the_agent_s_words_reads_back(name, code, output):
    table = agents.shapes(name)
    assert table is not None
    assert common.exit_code(table, common.with_exit(table, code, output)) == code


def test_the_agents_name_mcp_tools_by_their_own_prefix():
    claude, gemini = agents.shapes("claude"), agents.shapes("gemini")
    assert claude is not None and gemini is not None
    assert common.kind_of(claude, "mcp__notes__lookup") == "mcp_tool_call"
    assert common.kind_of(gemini, "mcp_notes_lookup") == "mcp_tool_call"
    assert common.kind_of(claude, "Glob") == common.kind_of(gemini, "glob") == "tool"


@pytest.mark.parametrize("name", ["claude", "codex", "opencode"])
@given(inp=COUNT, cached=COUNT, creation=COUNT, output=COUNT)
def test_a_turn_s_tokens_written_then_read_keep_their_disjoint_counts(name, inp, cached, creation, output):
    """native_usage (the writers) and read_usage + request_tokens (the readers) are inverse:
    cache reads and output come back as written; cache writes too where the agent has a field
    for them, else they are counted as input (Codex), so the total never changes."""
    table = agents.shapes(name)
    assert table is not None
    own = {"input_tokens": inp, "cached_input_tokens": cached, "cache_creation_tokens": creation,
           "output_tokens": output}
    back = common.request_tokens(table.usage, common.read_usage(table.usage, common.native_usage(table.usage, own)))
    assert (back["cached_input"], back["output"]) == (cached, output)
    assert back["input"] + back["cache_creation"] == inp + creation
    has_writes = any(dst in ("cache_creation_tokens", "cache_write_input_tokens") for _, dst in table.usage.fields)
    assert back["cache_creation"] == (creation if has_writes else 0)


def test_the_four_usage_objects_read_by_one_function():
    shapes = {name: agents.shapes(name) for name in agents.AGENTS}
    claude = shapes["claude"].usage  # type: ignore[union-attr]
    assert common.read_usage(claude, {"input_tokens": 5, "cache_read_input_tokens": 100,
                                      "cache_creation_input_tokens": 7, "output_tokens": 3}) == {
        "input_tokens": 5, "cached_input_tokens": 100, "cache_creation_tokens": 7, "output_tokens": 3}
    gemini = shapes["gemini"].usage  # type: ignore[union-attr]
    assert common.read_usage(gemini, {"input": 9, "cached": 2, "output": 5, "thoughts": 7}) == {
        "input_tokens": 9, "cached_input_tokens": 2, "output_tokens": 12, "reasoning_output_tokens": 7}
    opencode = shapes["opencode"].usage  # type: ignore[union-attr]
    assert common.read_usage(opencode, {"input": 5, "output": 3, "reasoning": 2, "cache": {"read": 7, "write": 1}}) == {
        "input_tokens": 13, "cached_input_tokens": 7, "output_tokens": 5, "cache_write_input_tokens": 1,
        "reasoning_output_tokens": 2}
    # a refused count is named, never read as zero in silence
    assert common.read_usage(opencode, {"input": -1, "output": 2})["usage_error"] == "input: -1 is not an integer in 0..2^53"
    assert common.read_usage(claude, "not an object") == {}


def test_only_claude_records_its_input_without_the_cache():
    assert [a for a in agents.AGENTS if agents.recorded_disjoint(a)] == ["claude"]
    assert not agents.recorded_disjoint("vtcode") and not agents.recorded_disjoint(None)


@given(ms=st.integers(min_value=1, max_value=253402300799999))
def test_an_opencode_time_reads_and_writes_back_to_the_millisecond(ms):
    text = common.iso_ms(ms)
    assert text is not None and text.endswith("Z")
    assert common.ms_of(text) == ms


def test_times_that_are_not_times_read_as_none():
    assert common.iso_ms(0) is None and common.iso_ms(True) is None and common.iso_ms(10**20) is None
    assert common.ms_of("yesterday") is None and common.parse_time(None) is None


def test_no_agent_folder_imports_another():
    """What several agents share is in memfs.agents.common (or changes, origin), so a folder
    can be added or removed alone."""
    import ast

    root = Path(memfs.__file__).parent / "agents"
    for agent in agents.AGENTS:
        for path in (root / agent).glob("*.py"):
            tree = ast.parse(path.read_text())
            names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + \
                [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            others = [m for m in names for o in agents.AGENTS
                      if o != agent and (m == f"memfs.agents.{o}" or m.startswith(f"memfs.agents.{o}."))]
            assert others == [], f"{path} imports {others}"
