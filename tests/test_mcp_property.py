"""Property (SPEC §13): whatever arguments an MCP client sends — random JSON values, strings with
control characters, huge integers, path-like strings, any Unicode — every tool call is answered
with a result (``isError`` allowed, never a protocol error), a resource read with a result or the
"no such resource" error, and the one ``memfs mcp`` stdio server serving them all stays up, reads
and writes nothing outside its store, creates or removes no session, and stays within a memory
bound."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import anyio.from_thread
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from mcp_helpers import config_file, kill, make_store, ok, server_pid

CANARY = "CANARY-7f3a9c-not-for-the-server"
SCHEMAS = {
    "search": {"query": "text", "k": "int", "min_score": "float", "session": "name", "stem": "text",
               "stopwords": "text", "in": "text", "agent": "text", "project": "path", "status": "text",
               "since": "text", "until": "text", "distinct": "text"},
    "list_sessions": {"agent": "text", "project": "path", "status": "text", "since": "text", "limit": "int"},
    "get_context": {"session": "name", "budget": "int"},
    "read_turn": {"session": "name", "turn": "int"},
    "get_usage": {"session": "name", "by": "text", "since": "text"},
    "append_note": {"session": "name", "text": "text", "kind": "text", "event": "json"},
}
PATHS = ["../../etc/passwd", "../canary.txt", "/etc/passwd", "retry/../../canary.txt", "..", ".", "retry",
         "retry/", "%2e%2e/canary.txt", "retry\x00", "~", "..\\..\\canary.txt", "retry/../codex", "/", "",
         "sessions/../../canary.txt", "retry/events.jsonl", "canary.txt", "\u202e", "a" * 300]

texts = st.one_of(st.text(max_size=60), st.sampled_from(PATHS),
                  st.text(alphabet="./%~\\\x00\n\t\x7fre", max_size=30),
                  st.builds(lambda a, b: a + b, st.sampled_from(PATHS), st.text(max_size=10)))
ints = st.one_of(st.integers(-5, 20), st.integers(-2**70, 2**70))
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=False, allow_infinity=False), texts)
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                            st.dictionaries(texts, inner, max_size=4)),
                           max_leaves=12)
names = st.one_of(st.sampled_from(["retry", "retry", "evil"]), texts)
of_kind = {"text": texts, "path": texts, "name": names, "int": ints, "float": st.floats(allow_nan=False,
                                                                                        allow_infinity=False),
           "json": json_values}


# well-formed calls whose values are still any text: the paths that read the store get their share
plausible = st.one_of(
    st.tuples(st.just("list_sessions"), st.fixed_dictionaries({}, optional={"project": texts, "since": texts})),
    st.tuples(st.just("search"), st.fixed_dictionaries({"query": st.one_of(texts, st.just("retry loop"))},
                                                       optional={"session": names, "project": texts})),
    st.tuples(st.just("get_context"), st.fixed_dictionaries({"session": names},
                                                            optional={"budget": st.integers(1, 5000)})),
    st.tuples(st.just("read_turn"), st.fixed_dictionaries({"session": names, "turn": st.integers(1, 3)})),
    st.tuples(st.just("get_usage"), st.fixed_dictionaries({}, optional={"session": names})),
    st.tuples(st.just("append_note"), st.fixed_dictionaries({"session": names, "text": texts})),
)


@st.composite
def calls(draw):
    """A tool (or an unknown one) and arguments: each of its own, typed or not, and strangers."""
    if draw(st.booleans()):
        return draw(plausible)
    name = draw(st.one_of(st.sampled_from(sorted(SCHEMAS)), texts))
    schema = SCHEMAS.get(name, {})
    args = {}
    for key in draw(st.lists(st.sampled_from(sorted(schema)), unique=True)) if schema else []:
        args[key] = draw(st.one_of(of_kind[schema[key]], json_values))
    args.update(draw(st.dictionaries(texts, json_values, max_size=2)))
    return name, args


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def tree(root: Path, skip: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` but ``skip``'s: (size, mtime_ns)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if Path(dirpath, d) != skip]
        for f in files:
            st_ = os.lstat(os.path.join(dirpath, f))
            out[os.path.join(dirpath, f)] = (st_.st_size, st_.st_mtime_ns)
    return out


def reads_update_atime(path: Path) -> bool:
    """Whether this filesystem records a read in the file's atime (relatime: when atime < mtime)."""
    os.utime(path, ns=(1_000_000_000, time.time_ns()))
    path.read_bytes()
    return path.stat().st_atime_ns != 1_000_000_000


def test_any_arguments_to_any_tool_are_answered_and_stay_in_the_store(tmp_path):
    store = make_store(tmp_path / "store")
    canary = tmp_path / "canary.txt"
    canary.write_text(CANARY + "\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "events.jsonl").write_text('{"type":"error","message":"%s"}\n' % CANARY)
    (store / "evil").symlink_to("../outside")  # a session name that leads out of the store
    conf = config_file(tmp_path, max_line_bytes=4096, idle_release=0.1)
    sessions = sorted(p.name for p in store.iterdir() if (p / "events.jsonl").exists())
    errlog = tmp_path / "mcp-stdio.log"
    params = StdioServerParameters(command=sys.executable, args=["-m", "memfs", "mcp", "--store", str(store),
                                                                 "--config", str(conf), "--allow-write"])
    atime_kept = reads_update_atime(canary)
    if atime_kept:
        os.utime(canary, ns=(1_000_000_000, time.time_ns()))
    outside = tree(tmp_path, store)
    seen = {"calls": 0, "errors": 0}
    try:
        with open(errlog, "w") as err, anyio.from_thread.start_blocking_portal() as portal, \
                portal.wrap_async_context_manager(Client(stdio_client(params, errlog=err),
                                                         read_timeout_seconds=60)) as client:
            pid = server_pid(errlog)
            assert pid is not None

            @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
            @given(call=calls(), uri=st.builds(lambda p: "memfs://sessions/" + p, texts))
            def answered(call, uri):
                name, args = call
                result = portal.call(client.call_tool, name, args)
                seen["calls"] += 1
                seen["errors"] += bool(result.is_error)
                for block in result.content:
                    assert CANARY not in getattr(block, "text", ""), (name, args)
                    if result.is_error:
                        assert "\n" not in block.text and block.text, (name, args)
                try:
                    contents = portal.call(client.read_resource, uri).contents
                except MCPError as exc:
                    assert CANARY not in str(exc)
                else:
                    assert all(CANARY not in getattr(c, "text", "") for c in contents), uri

            answered()
            # still serving, within a memory bound
            assert ok(portal.call(client.call_tool, "list_sessions", {}))["sessions"]
            assert rss_kib(pid) < 300 * 1024, rss_kib(pid)
    finally:
        kill(server_pid(errlog) if errlog.exists() else None)
    assert seen["calls"] >= 50 and 0 < seen["errors"] < seen["calls"]
    # nothing outside the store changed (the server's own log aside), nor was read; no session came or went
    after = tree(tmp_path, store)
    after.pop(str(errlog), None)
    outside.pop(str(errlog), None)
    assert after == outside
    assert sorted(p.name for p in store.iterdir() if (p / "events.jsonl").exists()) == sessions
    if atime_kept:
        assert canary.stat().st_atime_ns == 1_000_000_000, "the canary outside the store was read"
