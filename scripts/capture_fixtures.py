"""Capture what the real agent CLIs write, offline, into tests/fixtures/agents/<agent>/<scenario>/.

Each scenario runs the CLI (installed by scripts/install_agents.sh) against the scripted model
server (tests/agents/model_server.py) in a sandbox under --root (HOME, CODEX_HOME, TMPDIR and a
tiny git repository as the project; stable paths, so re-captures differ only in ids and times),
then copies, unchanged: the CLI's stdout stream (stream.jsonl, or stream.N.jsonl for the Nth run
of a resumed conversation), its stderr when not empty, the files the CLI wrote in its own store
(under home/, at the same relative paths; OpenCode's database as a SQLite backup:
docs/agents.md), the requests the server received with the bulky tool and system-prompt
definitions cut down (requests.jsonl), and capture.json (CLI, version,
date, sandbox root, script, command lines, exit codes, file list). docs/agents.md lists the
scenarios.

Usage: .venv/bin/python scripts/capture_fixtures.py [--agent claude|codex|gemini|opencode]... [--scenario NAME]...
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "agents"))
from clis import AGENTS, BIN, VERSIONS, installed  # noqa: E402
from model_server import ModelServer  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "agents"
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex", "gemini": "@google/gemini-cli",
            "opencode": "opencode-ai"}


def shell(agent: str, command: str, description: str = "") -> dict:
    """A call of the agent's own shell tool."""
    if agent == "claude":
        return {"name": "Bash", "arguments": {"command": command, "description": description}}
    if agent == "codex":
        return {"name": "exec_command", "arguments": {"cmd": command}}
    if agent == "opencode":
        return {"name": "bash", "arguments": {"command": command, "description": description}}
    return {"name": "run_shell_command", "arguments": {"command": command, "description": description}}


def text(t: str, **kw) -> dict:
    return {"text": t, **kw}


def call(tool: dict | list, t: str | None = None, **kw) -> dict:
    step = {"tools": tool} if isinstance(tool, list) else {"tool": tool}
    return {**({"text": t} if t else {}), **step, **kw}


# --- the scenarios: per agent, {"prompts": [...], "script": {...}, "options": {...}} --------

def ok_failing_command(agent):
    return {"about": "a successful run in which a shell command fails (cat of a missing file, exit 1)",
            "prompts": ["Show me the changelog"],
            "script": {"steps": [call(shell(agent, "cat CHANGELOG.md", "Show the changelog")),
                                 text("There is no CHANGELOG.md in this project.")]}}


def api_error(agent):
    if agent == "opencode":  # it retries a 5xx (or 429) without end, backing off: a 400 is not retried
        return {"about": "the API answers HTTP 400 (OpenCode retries a 5xx without a limit); the run fails",
                "prompts": ["Summarize the README"], "expect_failure": True,
                "script": {"steps": [{"error": {"status": 400, "message": "Invalid request: model is not available"},
                                      "repeat": 50}]}}
    return {"about": "the API answers HTTP 500 until the CLI's retries are exhausted; the run fails",
            "prompts": ["Summarize the README"], "expect_failure": True,
            "options": {"retries": {"claude": 2, "codex": 1, "gemini": 1}[agent]},
            "script": {"steps": [{"error": {"status": 500}, "repeat": 50}]}}


def http_500_then_ok(agent):
    return {"about": "one HTTP 500, then the retried request succeeds",
            "prompts": ["Summarize the README"], "options": {"retries": 2},
            "script": {"steps": [{"error": {"status": 500}},
                                 text("The README describes a tiny demo project.")]}}


def mcp_call(agent):
    lookup = {"key": "release"}
    steps = {
        # Claude Code defers MCP tools: the model first loads the schema with ToolSearch
        "claude": [call({"name": "ToolSearch", "arguments": {"query": "select:mcp__notes__lookup", "max_results": 1}}),
                   call({"name": "mcp__notes__lookup", "arguments": lookup})],
        # Codex defers them too: a client-side tool_search call, then a function call in the
        # mcp__notes namespace
        "codex": [call({"item": {"type": "tool_search_call", "execution": "client",
                                 "arguments": {"query": "notes lookup", "limit": 3}}}),
                  call({"name": "lookup", "namespace": "mcp__notes", "arguments": lookup})],
        "gemini": [call({"name": "mcp_notes_lookup", "arguments": lookup})],
        "opencode": [call({"name": "notes_lookup", "arguments": lookup})],
    }[agent]
    return {"about": "the model calls tool `lookup` of the stdio MCP server `notes` (tests/agents/notes_mcp.py)",
            "prompts": ["Look up the release note"], "options": {"mcp": True},
            "script": {"steps": steps + [text("The release note says: v1.2 ships on Friday.")]}}


def tasks(agent):
    if agent == "claude":
        def update(i, status):
            return {"name": "TaskUpdate", "arguments": {"taskId": str(i), "status": status}}
        steps = [call({"name": "ToolSearch", "arguments": {"query": "select:TaskCreate,TaskUpdate", "max_results": 2}}),
                 call([{"name": "TaskCreate", "arguments": {"subject": "Read the README", "description": "Read README.md",
                                                            "activeForm": "Reading the README"}},
                       {"name": "TaskCreate", "arguments": {"subject": "Write the summary",
                                                            "description": "Summarize README.md in one line",
                                                            "activeForm": "Writing the summary"}}]),
                 call(update(1, "in_progress")),
                 call([update(1, "completed"), update(2, "completed")])]
    elif agent == "codex":
        def plan(a, b, explanation=None):
            return {"name": "update_plan", "arguments": {**({"explanation": explanation} if explanation else {}),
                                                          "plan": [{"step": "Read the README", "status": a},
                                                                   {"step": "Write the summary", "status": b}]}}
        steps = [call(plan("in_progress", "pending", "Two steps")), call(plan("completed", "in_progress")),
                 call(plan("completed", "completed"))]
    elif agent == "opencode":
        def todos(a, b):
            return {"name": "todowrite", "arguments": {"todos": [
                {"content": "Read the README", "status": a, "priority": "high"},
                {"content": "Write the summary", "status": b, "priority": "medium"}]}}
        steps = [call(todos("in_progress", "pending")), call(todos("completed", "in_progress")),
                 call(todos("completed", "completed"))]
    else:
        def todos(a, b):
            return {"name": "write_todos", "arguments": {"todos": [{"description": "Read the README", "status": a},
                                                                   {"description": "Write the summary", "status": b}]}}
        steps = [call(todos("in_progress", "pending")), call(todos("completed", "in_progress")),
                 call(todos("completed", "completed"))]
    return {"about": "the agent's todo/plan tool: a two-item list created, then both items completed",
            "prompts": ["Plan the work: read the README, then summarize it"], "options": {"todo": True},
            "script": {"steps": steps + [text("Both steps are done.")]}}


def subagent(agent):
    if agent == "claude":
        spawn = {"name": "Agent", "arguments": {"description": "List project files",
                                                "prompt": "List the files in the project and report them.",
                                                "subagent_type": "general-purpose", "run_in_background": False}}
        finish = [text("The project has one file: README.md.")]
    elif agent == "gemini":
        spawn = {"name": "invoke_agent", "arguments": {"agent_name": "generalist",
                                                       "prompt": "List the files in the project and report them."}}
        finish = [call({"name": "complete_task",
                        "arguments": {"result": {"response": "The project has one file: README.md."}}})]
    elif agent == "opencode":
        spawn = {"name": "task", "arguments": {"description": "List project files",
                                               "prompt": "List the files in the project and report them.",
                                               "subagent_type": "general"}}
        finish = [text("The project has one file: README.md.")]
    else:
        return None  # docs/agents.md: why Codex's sub-agents are not captured
    # the sub-agent runs in the foreground: its requests come between the parent's two
    return {"about": "the agent delegates to a sub-agent, which runs one shell command and reports back",
            "prompts": ["Ask a helper to list the project files"],
            "script": {"steps": [call(spawn, "I'll ask a helper."), call(shell(agent, "ls", "List files")),
                                 *finish, text("The helper found one file: README.md.")]}}


def resume_two_turns(agent):
    return {"about": "a first run (a shell command and an answer), then the CLI's resume with a second prompt",
            "prompts": ["What files are in the project?", "What is the project about?"],
            "script": {"steps": [call(shell(agent, "ls", "List files")), text("The project has one file: README.md."),
                                 text("It is a tiny demo project.")]}}


def compact(agent):
    summary = "The user asked which files the project has; the answer was README.md."
    if agent == "opencode":  # automatic: the first turn used more than the model's context less its output
        return {"about": "auto-compaction: the first answer reports more tokens than the model's context (20,000), "
                         "so OpenCode at once asks for a summary, adds a synthetic 'Continue…' message and answers "
                         "it; then a continued run (run --session) with a second prompt",
                "prompts": ["What files are in the project?", "What is the project about?"],
                "options": {"context": 20000},
                "script": {"steps": [text("The project has one file: README.md.", usage={"input": 30000, "output": 50}),
                                     text(summary), text("Nothing more to do."), text("It is a tiny demo project.")]}}
    summary = "The user asked which files the project has; the answer was README.md."
    if agent == "claude":  # /compact works in -p mode: a resumed run whose prompt is /compact
        return {"about": "a turn, then `/compact` (a summarization request), then a turn after the compaction",
                "prompts": ["What files are in the project?", "/compact", "What is the project about?"],
                "script": {"steps": [text("The project has one file: README.md."),
                                     text(f"<analysis>Short conversation.</analysis>\n<summary>{summary}</summary>"),
                                     text("It is a tiny demo project.")]}}
    if agent == "codex":  # automatic: the first turn reports more tokens than the limit
        return {"about": "auto-compaction: the first turn uses more tokens than model_auto_compact_token_limit, "
                         "so the resumed run first asks for a summary (a request without tools), then answers",
                "prompts": ["What files are in the project?", "What is the project about?"],
                "options": {"compact_limit": 2000},
                "script": {"steps": [text("The project has one file: README.md.", usage={"input": 5000, "output": 50}),
                                     text(summary), text("It is a tiny demo project.")]}}
    # Gemini compresses before a model call when the last prompt used more than half the
    # model's window, and only with an earlier user turn to fold: so in a resumed run
    return {"about": "auto-compression: in the resumed run a tool call reports 900k prompt tokens, so before the "
                     "next model call Gemini CLI asks for a <state_snapshot> (and a verification) and rewrites the "
                     "chat history",
            "prompts": ["What files are in the project?", "What is the project about?"],
            "script": {"side": [{"when": {"path": ":generateContent", "contains": "<state_snapshot>"},
                                 "text": f"<state_snapshot>{summary}</state_snapshot>"}],
                       "steps": [text("The project has one file: README.md."),
                                 call(shell(agent, "ls", "List files"), usage={"input": 900000, "output": 20}),
                                 text("It is a tiny demo project.")]}}


def plain(agent):
    if agent != "opencode":
        return None  # the other CLIs' plain turns are in http_500_then_ok and the other scenarios
    return {"about": "one prompt, one answer, no tool", "prompts": ["Say hello"],
            "script": {"steps": [text("Hello! How can I help with this project?")]}}


def interrupted(agent):
    if agent != "opencode":
        return None  # not captured for the other CLIs
    return {"about": "a command runs, then the next model request hangs and the run is interrupted (SIGINT, "
                     "as Ctrl-C) while it waits", "prompts": ["List the files, then describe each"],
            "interrupt": True,
            "script": {"steps": [call(shell(agent, "ls", "List files")), {"hang": 60}]}}


def model_switch(agent):
    if agent == "opencode":
        return None
    models = {"claude": ["claude-opus-5-5", "claude-haiku-4-5"], "codex": ["gpt-5.5", "gpt-5.4-mini"],
              "gemini": ["gemini-2.5-pro", "gemini-2.5-flash"]}
    return {"about": "a run of two requests (a shell command, then the answer) on one model, then the conversation "
                     "resumed on another model (--model / -m): each request names its model",
            "prompts": ["What files are in the project?", "What is the project about?"],
            "models": models[agent],
            "script": {"steps": [call(shell(agent, "ls", "List files")), text("The project has one file: README.md."),
                                 text("It is a tiny demo project.")]}}


def model_command(agent):
    if agent != "claude":
        return None
    # in -p mode the command sets the model "for this session only" (that process) after a one-token
    # probe of the new model ("Hi", max_tokens 1: the second step); the next resumed run is back on the default
    return {"about": "a turn, then `/model claude-haiku-4-5` in a resumed -p run (a local command and a one-token "
                     "probe of the model), then a turn in a further resumed run",
            "prompts": ["What files are in the project?", "/model claude-haiku-4-5", "What is the project about?"],
            "script": {"steps": [text("The project has one file: README.md."), text("Hi."),
                                 text("It is a tiny demo project.")]}}


def large_output(agent):
    if agent != "claude":
        return None
    return {"about": "a command whose output is too big for the transcript: Claude Code stores it in "
                     "<session>/tool-results/<id>.txt and references it",
            "prompts": ["Print the numbers 1 to 8000"],
            "script": {"steps": [call(shell(agent, "seq 1 8000", "Print numbers")), text("Printed 8000 numbers.")]}}


SCENARIOS = {f.__name__: f for f in (plain, ok_failing_command, api_error, http_500_then_ok, mcp_call, tasks,
                                      subagent, resume_two_turns, compact, large_output, interrupted, model_switch,
                                      model_command)}


# --- capture ----------------------------------------------------------------------------------

def with_usage(script: dict) -> dict:
    """Distinct, small usage numbers on every step that has none (so sums can be checked)."""
    steps = []
    for n, step in enumerate(script.get("steps", [])):
        steps.append(step if "usage" in step or "error" in step
                     else {**step, "usage": {"input": 1000 + 100 * n, "output": 20 + 5 * n, "cached": 0}})
    return {**script, "steps": steps}


def trim_request(rec: dict) -> dict:
    """A recorded request without the bulky, constant parts: tool definitions become their
    names, system prompts and Codex's developer messages their length."""
    body = rec.get("body")
    if isinstance(body, dict):
        body = dict(body)
        if isinstance(body.get("tools"), list):
            names = []
            for t in body["tools"]:
                if isinstance(t, dict) and "functionDeclarations" in t:
                    names += [f.get("name") for f in t["functionDeclarations"]]
                elif isinstance(t, dict):
                    names.append(t.get("name") or t.get("type"))
            body["tools"] = names
        for key in ("system", "instructions", "systemInstruction"):
            if key in body:
                body[key] = f"({len(json.dumps(body[key]))} characters, left out)"
        if isinstance(body.get("input"), list):  # Codex: its instructions are developer messages
            body["input"] = [{**item, "content": f"({len(json.dumps(item.get('content')))} characters, left out)"}
                             if isinstance(item, dict) and item.get("role") == "developer" else item
                             for item in body["input"]]
    return {**rec, "body": body}


def capture(agent_name: str, scenario: str, spec: dict, root: Path, out: Path) -> bool:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    script = with_usage(spec["script"])
    side = getattr(AGENTS[agent_name], "side", [])  # requests the CLI makes besides the turn (OpenCode's title)
    if side:
        script = {**script, "side": [*side, *script.get("side", [])]}
    options = spec.get("options", {})
    runs, ok = [], True
    with ModelServer(script, root / "requests.jsonl") as server:
        agent = AGENTS[agent_name](root, server.url, options)
        session = None
        for n, prompt in enumerate(spec["prompts"], 1):
            agent.run_model = (spec.get("models") or [None] * n)[n - 1]
            if spec.get("interrupt") and n == len(spec["prompts"]):  # Ctrl-C while the model server holds a request
                run = agent.run_interrupted(prompt, lambda: any(r["status"] == 0 for r in server.requests()))
            else:
                run = agent.run(prompt, resume=session)
            if session is None:
                try:
                    session = agent.session_id(run)
                except ValueError:
                    pass
            runs.append((n, prompt, run))
            failed = run.exit_code != 0
            if failed != bool(spec.get("expect_failure")) and not spec.get("interrupt"):
                ok = False
                print(f"  ! run {n} exited {run.exit_code}:\n{run.stderr.decode(errors='replace')[-2000:]}")
        requests = server.requests()
    if options.get("mcp") and not agent.mcp_log.exists():
        ok = False
        print("  ! the MCP server was not called")

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    many = len(runs) > 1
    run_docs = []
    for n, prompt, run in runs:
        stdout = f"stream.{n}.jsonl" if many else "stream.jsonl"
        (out / stdout).write_bytes(run.stdout)
        stderr = None
        if run.stderr.strip():
            stderr = f"stderr.{n}.txt" if many else "stderr.txt"
            (out / stderr).write_bytes(run.stderr)
        run_docs.append({"prompt": prompt, "argv": [Path(run.argv[0]).name, *run.argv[1:]], "cwd": run.cwd,
                         "env": run.env, "exit_code": run.exit_code, "seconds": round(run.seconds, 2),
                         "stdout": stdout, "stderr": stderr})
    stored = agent.store_files()
    links = {}
    for f in stored:
        if f.is_symlink():  # e.g. Claude's sub-agent .output -> its transcript: noted, not copied twice
            links[str(f.relative_to(root))] = str(Path(f.readlink()))
            continue
        dest = out / f.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        getattr(agent, "copy_file", shutil.copy2)(f, dest)  # OpenCode: a SQLite backup of its database
    with open(out / "requests.jsonl", "w") as f:
        for rec in requests:
            f.write(json.dumps(trim_request(rec)) + "\n")
    config = {str(p.relative_to(root)): p.read_text()
              for p in (root / "home/.codex/config.toml", root / "home/.gemini/settings.json",
                        root / "home/.config/opencode/opencode.json") if p.exists()}
    version = subprocess.run([str(BIN / agent_name), "--version"], capture_output=True, text=True).stdout.strip()
    files = sorted([str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()] + ["capture.json"])
    doc = {"agent": agent_name, "package": PACKAGES[agent_name], "version": VERSIONS[agent_name],
           "version_output": version, "scenario": scenario, "about": spec["about"],
           "captured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "root": str(root), "home": str(root / "home"), "cwd": str(root / "proj"),
           "session_id": session, "options": options, "models": spec.get("models"), "config_files": config, "script": script,
           "runs": run_docs, "store_files": [str(p.relative_to(root)) for p in stored if not p.is_symlink()],
           "store_symlinks": links,
           "requests": "requests.jsonl", "files": files}
    (out / "capture.json").write_text(json.dumps(doc, indent=1) + "\n")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"  {'ok' if ok else 'FAILED'}: {len(files)} files, {size // 1024} KiB, "
          f"exit {[r['exit_code'] for r in run_docs]}, {sum(r['seconds'] for r in run_docs):.1f}s")
    return ok


def run_scenarios(prog: str, description: str, scenarios: dict, root: Path, out: Path,
                  wipe_root: bool = False) -> int:
    """The command line of a capture script: ``--agent``, ``--scenario``, ``--root``, ``--out``;
    each chosen scenario (a function of the agent giving its spec, or None where that agent
    cannot play it) captured with :func:`capture`; exit status 1 if any failed. ``wipe_root``:
    remove the sandbox directory afterwards."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--agent", action="append", choices=sorted(AGENTS))
    ap.add_argument("--scenario", action="append", choices=sorted(scenarios))
    ap.add_argument("--root", type=Path, default=root,
                    help="sandbox directory (wiped per scenario); default %(default)s")
    ap.add_argument("--out", type=Path, default=out)
    args = ap.parse_args()
    why = installed()
    if why:
        print(f"{prog}: {why}", file=sys.stderr)
        return 1
    failed = []
    for agent in args.agent or sorted(AGENTS):
        for name in args.scenario or scenarios:
            spec = scenarios[name](agent)
            if spec is None:
                continue
            print(f"{agent}/{name}: {spec['about']}")
            if not capture(agent, name, spec, args.root / agent / name, args.out / agent / name):
                failed.append(f"{agent}/{name}")
    if wipe_root:
        shutil.rmtree(args.root, ignore_errors=True)
    if failed:
        print(f"{prog}: failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def main() -> int:
    return run_scenarios("capture_fixtures", __doc__.split("\n\n")[0], SCENARIOS,
                         Path("/tmp/memfs-agent-capture"), FIXTURES)


if __name__ == "__main__":
    sys.exit(main())
