"""Capture the real agent sessions of the search relevance set (bench/relevance/captures/).

Each scenario is a small, realistic piece of work — tests that fail and get fixed, a retry
loop against a dead port, a build without a rule, a broken config, a missing module, a
timeout — run by the real CLIs (Claude Code, Codex, Gemini CLI) offline against the scripted
model server, exactly as scripts/capture_fixtures.py captures the test fixtures (same sandbox,
same capture; the commands really run in the sandbox project and their outputs are real).
The labels in bench/relevance/queries.json are written by hand against these captures; a
re-capture changes the session ids, so the labels must be redone after one.

Usage: .venv/bin/python scripts/capture_relevance.py [--agent claude|codex|gemini]... [--scenario NAME]...
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capture_fixtures import call, run_scenarios, shell, text  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "bench" / "relevance" / "captures"

CALC = """cat > calc.py <<'EOF'
def add(a, b):
    return a + b + 1


def mul(a, b):
    return a * b
EOF
cat > test_calc.py <<'EOF'
import unittest
from calc import add, mul


class CalcTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 2), 4)

    def test_mul(self):
        self.assertEqual(mul(3, 3), 9)


if __name__ == "__main__":
    unittest.main()
EOF"""

CLIENT = """cat > http_client.py <<'EOF'
import time
import urllib.request


def fetch(url, attempts=3, backoff=0.1):
    for attempt in range(1, attempts + 1):
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.read()
        except OSError as exc:
            print(f"attempt {attempt} failed: {exc}")
            if attempt == attempts:
                raise
            time.sleep(backoff * 2 ** attempt)
EOF"""

CONFIG = """cat > config.json <<'EOF'
{
  "host": "127.0.0.1",
  "port": 8080,
}
EOF"""


def unit_tests(agent):
    return {"about": "the unit tests fail (an off-by-one in calc.add), the agent fixes it, the tests pass",
            "prompts": ["Write calc.py with add and mul plus unit tests, and run them",
                        "Fix the failing test"],
            "script": {"steps": [
                call(shell(agent, CALC, "Write calc.py and its tests")),
                call(shell(agent, "python3 -m unittest -v test_calc", "Run the unit tests")),
                text("test_add fails: add(2, 2) returns 5 instead of 4. test_mul passes."),
                call(shell(agent, "sed -i 's/return a + b + 1/return a + b/' calc.py && python3 -m unittest -v test_calc",
                           "Fix add and rerun the tests")),
                text("Fixed the off-by-one in calc.add; both tests pass now.")]}}


def retry_loop(agent):
    return {"about": "a retry loop with exponential backoff in fetch(), tried against a port where nothing listens",
            "prompts": ["Add a retry loop with backoff to the HTTP client and try it against the health endpoint"],
            "script": {"steps": [
                call(shell(agent, CLIENT, "Write http_client.py with a retry loop")),
                call(shell(agent, "python3 -c \"import http_client; http_client.fetch('http://127.0.0.1:9/health')\"",
                           "Try the client against a dead port")),
                text("fetch() now retries 3 times with exponential backoff. Against 127.0.0.1:9 every attempt "
                     "is refused, so the last ConnectionRefusedError is raised to the caller.")]}}


def build_rule(agent):
    return {"about": "make build fails (no Makefile), the agent writes one, the build succeeds",
            "prompts": ["Build the project"],
            "script": {"steps": [
                call(shell(agent, "make build", "Build")),
                call(shell(agent, "printf 'build:\\n\\tmkdir -p dist && cp README.md dist/\\n' > Makefile && make build",
                           "Add a Makefile with a build target and build")),
                text("There was no Makefile, so make build had no rule. I added a build target that copies "
                     "the README into dist/; the build works now.")]}}


def bad_config(agent):
    return {"about": "config.json does not parse (a trailing comma); the agent finds and fixes it",
            "prompts": ["Why does the server config not load?"],
            "script": {"steps": [
                call(shell(agent, CONFIG, "Write the config")),
                call(shell(agent, "python3 -c \"import json; print(json.load(open('config.json')))\"", "Load the config")),
                text("config.json is not valid JSON: there is a trailing comma after the port setting."),
                call(shell(agent, "sed -i 's/8080,/8080/' config.json && python3 -c \"import json; "
                                  "print(json.load(open('config.json')))\"", "Remove the comma and load it again")),
                text("Removed the trailing comma; the config loads: host 127.0.0.1, port 8080.")]}}


def missing_module(agent):
    return {"about": "plotting needs matplotlib, which is not installed",
            "prompts": ["Plot the response times as a chart"],
            "script": {"steps": [
                call(shell(agent, "python3 -c \"import matplotlib.pyplot as plt\"", "Check for matplotlib")),
                text("matplotlib is not installed in this environment (ModuleNotFoundError). Install it with "
                     "pip install matplotlib and I can draw the chart.")]}}


def slow_command(agent):
    return {"about": "a slow script is killed by a 2-second timeout (exit 124)",
            "prompts": ["Run the nightly job but stop it if it takes more than 2 seconds"],
            "script": {"steps": [
                call(shell(agent, "printf 'import time\\nprint(\"job started\")\\ntime.sleep(30)\\n' > nightly.py && "
                                  "timeout 2 python3 nightly.py; echo \"exit status $?\"", "Run the job with a timeout")),
                text("The nightly job printed 'job started' and was killed by the timeout after 2 seconds "
                     "(exit status 124); it sleeps for 30 seconds.")]}}


def git_history(agent):
    return {"about": "what changed in the last commit: git log and git show",
            "prompts": ["What changed in the last commit?"],
            "script": {"steps": [
                call(shell(agent, "git log --oneline -3 && git show --stat HEAD", "Show the last commit")),
                text("The last commit is the initial one, 'init'; it added README.md (3 lines).")]}}


def rename_function(agent):
    return {"about": "a rename across files: fetch_data becomes load_records",
            "prompts": ["Rename fetch_data to load_records everywhere"],
            "script": {"steps": [
                call(shell(agent, "printf 'def fetch_data(path):\\n    return open(path).read()\\n' > loader.py && "
                                  "printf 'from loader import fetch_data\\n\\nprint(fetch_data(\"README.md\"))\\n' > main.py",
                           "Write the loader")),
                call(shell(agent, "sed -i 's/fetch_data/load_records/g' loader.py main.py && grep -rn "
                                  "'load_records\\|fetch_data' --include=*.py . && python3 main.py", "Rename and check")),
                text("Renamed fetch_data to load_records in loader.py and main.py; main.py still prints the README.")]}}


SCENARIOS = {f.__name__: f for f in (unit_tests, retry_loop, build_rule, bad_config, missing_module, slow_command,
                                      git_history, rename_function)}


def main() -> int:
    return run_scenarios("capture_relevance", __doc__.split("\n\n")[0], SCENARIOS,
                         Path("/tmp/memfs-relevance-capture"), OUT, wipe_root=True)


if __name__ == "__main__":
    sys.exit(main())
