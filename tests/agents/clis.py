"""The real agent CLIs (installed by scripts/install_agents.sh into .agents/), run offline against
tests/agents/model_server.py: each in its own temporary HOME (Codex: CODEX_HOME under it) and a
tiny git repository as the project, with an environment built from scratch (no inherited keys)
whose only reachable host is 127.0.0.1. Used by tests/test_agents_cli.py and
scripts/capture_fixtures.py; docs/agents.md explains the settings."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".agents" / "node_modules" / ".bin"
NOTES_MCP = Path(__file__).with_name("notes_mcp.py")
VERSIONS = {"claude": "2.1.332", "codex": "0.171.0", "gemini": "0.61.0", "opencode": "1.18.33"}  # scripts/install_agents.sh


def installed() -> str | None:
    """None when every CLI is installed, else why not (for a skip or a failure message)."""
    if shutil.which("node") is None:
        return "node is not installed"
    missing = [name for name in VERSIONS if not os.access(BIN / name, os.X_OK)]
    if missing:
        return f"{', '.join(missing)} not installed in .agents/ (run: bash scripts/install_agents.sh)"
    return None


def make_project(path: Path) -> Path:
    """A tiny git repository: the agent's working directory."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "README.md").write_text("# demo\n\nA tiny project for the agent fixtures.\n")
    git = ["git", "-c", "user.name=memfs", "-c", "user.email=memfs@example.invalid"]
    for cmd in (["init", "-q", "-b", "main"], ["add", "README.md"], ["commit", "-q", "-m", "init"]):
        subprocess.run(git + cmd, cwd=path, check=True, env={"PATH": os.environ["PATH"], "HOME": str(path)})
    return path


def base_env(home: Path) -> dict:
    """No inherited secrets; any host but 127.0.0.1 goes to a dead proxy and fails at once;
    temporary files (Gemini's error reports) under HOME."""
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    node = Path(shutil.which("node") or "/usr/bin/node").parent
    return {"HOME": str(home), "TMPDIR": str(home / "tmp"), "PATH": f"{node}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8", "TERM": "dumb", "NO_COLOR": "1", "TZ": "UTC",
            "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9",
            "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9",
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}


def mcp_server_command() -> list[str]:
    return [sys.executable, str(NOTES_MCP)]


def _files(*dirs: Path, skip=lambda p: False) -> list[Path]:
    return sorted(p for d in dirs for p in d.rglob("*") if p.is_file() and not skip(p))


@dataclass
class Run:
    argv: list[str]
    cwd: str
    env: dict
    exit_code: int
    stdout: bytes
    stderr: bytes
    seconds: float


def run_in_group(argv: list[str], cwd: Path, env: dict, timeout: float = 90) -> Run:
    """Run ``argv`` in its own process group; whatever happens, nothing of it is left running
    (the group is killed by its id)."""
    t = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the agent and anything it left behind
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.wait(5)
    return Run(argv, str(cwd), env, proc.returncode, out, err, time.monotonic() - t)


@dataclass
class Agent:
    """One CLI in one sandbox (``root``: home/, proj/); ``url``: the model server."""

    root: Path
    url: str
    options: dict = field(default_factory=dict)  # per-scenario: retries, mcp, todo, compact
    name = ""
    run_model: str | None = None  # the model the next run asks for (--model), else the CLI's default

    def __post_init__(self):
        self.home = self.root / "home"
        self.proj = self.root / "proj"
        self.mcp_log = self.root / "notes_mcp.log"  # one line per call that reached tests/agents/notes_mcp.py
        self.home.mkdir(parents=True, exist_ok=True)
        if not self.proj.exists():
            make_project(self.proj)
        self.setup()

    def setup(self) -> None:
        pass

    def env(self) -> dict:
        return base_env(self.home)

    def argv(self, prompt: str, resume: str | None = None) -> list[str]:
        raise NotImplementedError

    def run(self, prompt: str, resume: str | None = None, timeout: float = 120) -> Run:
        argv, env = self.argv(prompt, resume), self.env()
        t = time.monotonic()
        p = subprocess.run(argv, cwd=self.proj, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=timeout)
        return Run(argv, str(self.proj), env, p.returncode, p.stdout, p.stderr, time.monotonic() - t)

    def run_interrupted(self, prompt: str, ready, timeout: float = 120) -> Run:
        """Run, and once ``ready()`` (polled until ``timeout``: e.g. the model server holds a
        request) send the CLI SIGINT, as Ctrl-C would; what it leaves running is killed."""
        argv, env = self.argv(prompt), self.env()
        t = time.monotonic()
        proc = subprocess.Popen(argv, cwd=self.proj, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while not ready() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if proc.poll() is None:
                proc.wait(5)
        return Run(argv, str(self.proj), env, proc.returncode, out, err, time.monotonic() - t)

    def session_id(self, run: Run) -> str:
        """The conversation id, from the CLI's stream on stdout."""
        for line in run.stdout.splitlines():
            ev = json.loads(line) if line.startswith(b"{") else {}
            for key in ("session_id", "thread_id"):
                if ev.get(key):
                    return ev[key]
        raise ValueError(f"{self.name}: no session id in its output")

    def store_files(self) -> list[Path]:
        """The files the CLI wrote in its own store for this conversation (and side files)."""
        raise NotImplementedError

    def store_text(self) -> str:
        """What the store holds, as text (to look for a prompt in it)."""
        return "".join(f.read_text(errors="replace") for f in self.store_files())


class Claude(Agent):
    name = "claude"

    def env(self) -> dict:
        env = {**super().env(), "IS_SANDBOX": "1", "ANTHROPIC_BASE_URL": self.url, "ANTHROPIC_API_KEY": "dummy",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
               "CLAUDE_CODE_MAX_RETRIES": str(self.options.get("retries", 2))}
        if self.options.get("todo"):
            env["CLAUDE_CODE_ENABLE_TODO_TOOLS"] = "true"
        return env

    def argv(self, prompt, resume=None):
        argv = [str(BIN / "claude"), "-p", prompt, "--output-format", "stream-json", "--verbose",
                "--dangerously-skip-permissions"]
        if resume:
            argv += ["--resume", resume]
        if self.run_model:
            argv += ["--model", self.run_model]
        if self.options.get("mcp"):
            cmd = mcp_server_command()
            cfg = {"mcpServers": {"notes": {"command": cmd[0], "args": cmd[1:],
                                            "env": {"NOTES_MCP_LOG": str(self.mcp_log)}}}}
            argv += ["--mcp-config", json.dumps(cfg), "--strict-mcp-config"]
        return argv

    def store_files(self):
        # the transcripts (with subagents/ and tool-results/), the task lists (tasks/<session>/N.json,
        # todos/), and the sub-agents' output files under $TMPDIR/claude-<uid>/<cwd slug>/<session>/tasks/
        claude = self.home / ".claude"
        return _files(claude / "projects", claude / "tasks", claude / "todos", *(self.home / "tmp").glob("claude-*"),
                      skip=lambda p: "fswatch-probe" in str(p) or p.name == ".lock")


class Codex(Agent):
    name = "codex"

    def setup(self):
        codex_home = self.home / ".codex"
        codex_home.mkdir(parents=True, exist_ok=True)
        retries = self.options.get("retries", 1)
        lines = ['model = "gpt-5.5"', 'model_provider = "scripted"', 'approval_policy = "never"',
                 'sandbox_mode = "danger-full-access"', "",
                 "[model_providers.scripted]", 'name = "scripted"', f'base_url = "{self.url}/v1"',
                 'env_key = "SCRIPTED_API_KEY"', 'wire_api = "responses"',
                 f"request_max_retries = {retries}", f"stream_max_retries = {retries}", ""]
        if self.options.get("todo"):
            lines += ["[tools.update_plan]", "enabled = true", ""]
        if self.options.get("compact_limit"):
            lines.insert(0, f"model_auto_compact_token_limit = {self.options['compact_limit']}")
        if self.options.get("mcp"):
            cmd = mcp_server_command()
            lines += ["[mcp_servers.notes]", f"command = {json.dumps(cmd[0])}", f"args = {json.dumps(cmd[1:])}",
                      f"env = {{ NOTES_MCP_LOG = {json.dumps(str(self.mcp_log))} }}",
                      # Codex waits for a required server before its first request; else a server slow to
                      # start on a loaded machine is left out of the tools the model is offered
                      "required = true", "startup_timeout_sec = 60", ""]
        (codex_home / "config.toml").write_text("\n".join(lines))

    def env(self):
        return {**super().env(), "CODEX_HOME": str(self.home / ".codex"), "SCRIPTED_API_KEY": "dummy"}

    def argv(self, prompt, resume=None):
        codex, model = str(BIN / "codex"), ["-m", self.run_model] if self.run_model else []
        if resume:
            return [codex, "exec", "--json", "resume", resume, *model, prompt]
        return [codex, "exec", "--json", *model, prompt]

    def store_files(self):
        codex_home = self.home / ".codex"
        return _files(codex_home / "sessions", codex_home / "archived_sessions")


class Gemini(Agent):
    name = "gemini"
    model = "gemini-2.5-pro"  # a fixed model: "auto" first asks a router model (a JSON side request)

    def setup(self):
        gdir = self.home / ".gemini"
        gdir.mkdir(parents=True, exist_ok=True)
        settings = {"security": {"auth": {"selectedType": "gemini-api-key"}},
                    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False,
                                "maxAttempts": self.options.get("retries", 1) + 1},
                    "privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False}}
        if self.options.get("mcp"):
            cmd = mcp_server_command()
            settings["mcpServers"] = {"notes": {"command": cmd[0], "args": cmd[1:], "trust": True,
                                                "env": {"NOTES_MCP_LOG": str(self.mcp_log)}}}
        (gdir / "settings.json").write_text(json.dumps(settings, indent=2))

    def env(self):
        return {**super().env(), "GEMINI_API_KEY": "dummy", "GOOGLE_GEMINI_BASE_URL": self.url,
                "GEMINI_CLI_TRUST_WORKSPACE": "true"}

    def argv(self, prompt, resume=None):
        argv = [str(BIN / "gemini"), "-m", self.run_model or self.model, "--approval-mode", "yolo",
                "--output-format", "stream-json"]
        if resume:
            argv += ["--resume", resume]
        return argv + ["-p", prompt]

    def store_files(self):
        # chats/ (with sub-agents' chats in chats/<session>/), logs; and the error reports it
        # writes to $TMPDIR/gemini-client-error-*.json
        return _files(self.home / ".gemini" / "tmp", skip=lambda p: p.name == ".project_root") + sorted(
            (self.home / "tmp").glob("gemini-client-error-*.json"))




class OpenCode(Agent):
    """OpenCode with a custom provider (``@ai-sdk/openai-compatible``, bundled in its binary) whose
    baseURL is the model server: it speaks Chat Completions. Its store is a SQLite database
    under ``$XDG_DATA_HOME/opencode/`` (here the default, ``~/.local/share/opencode``)."""

    name = "opencode"
    model = "gpt-5.5"
    # before the first turn of a session it asks the same model for a title (no tools, its own
    # system prompt): a side step answers that request without using up the scenario's steps
    side = [{"when": {"api": "chat", "contains": "You are a title generator"}, "text": "Scripted title",
             "usage": {"input": 300, "output": 5}}]

    def setup(self):
        cdir = self.home / ".config" / "opencode"
        cdir.mkdir(parents=True, exist_ok=True)
        config = {"$schema": "https://opencode.ai/config.json", "model": f"scripted/{self.model}",
                  "autoupdate": False, "share": "disabled", "permission": "allow",
                  "provider": {"scripted": {"npm": "@ai-sdk/openai-compatible", "name": "Scripted",
                                            "options": {"baseURL": f"{self.url}/v1", "apiKey": "dummy"},
                                            # a price (USD per million tokens), so that its own cost is not 0
                                            "models": {self.model: {"name": self.model, "tool_call": True,
                                                                    "cost": {"input": 1.25, "output": 10},
                                                                    "limit": {"context": self.options.get("context", 200000),
                                                                              "output": 8192}}}}}}
        if self.options.get("mcp"):
            config["mcp"] = {"notes": {"type": "local", "command": mcp_server_command(),
                                       "environment": {"NOTES_MCP_LOG": str(self.mcp_log)}}}
        (cdir / "opencode.json").write_text(json.dumps(config, indent=2))

    def env(self):
        return {**super().env(), "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
                "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_SHARE": "1",
                "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_CLAUDE_CODE": "1",
                "OPENCODE_DISABLE_TERMINAL_TITLE": "1"}

    def argv(self, prompt, resume=None):
        argv = [str(BIN / "opencode"), "run", "--format", "json"]
        if resume:
            argv += ["--session", resume]
        return argv + [prompt]

    def session_id(self, run: Run) -> str:
        for line in run.stdout.splitlines():
            ev = json.loads(line) if line.startswith(b"{") else {}
            if ev.get("sessionID"):
                return ev["sessionID"]
        raise ValueError(f"{self.name}: no session id in its output")

    def store_files(self):
        # the database (not -shm, SQLite's shared-memory index; not log/, snapshot/ — a git
        # repository of the project's files per step — nor repos/); see copy_file for the WAL
        db = self.home / ".local" / "share" / "opencode" / "opencode.db"
        return [db] if db.is_file() else []

    def store_text(self) -> str:
        import sqlite3

        text = []
        for db in self.store_files():  # read through SQLite: the rows are in the WAL
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                text += [row[0] for row in conn.execute("SELECT data FROM part")]
            finally:
                conn.close()
        return "\n".join(text)

    @staticmethod
    def copy_file(src: Path, dest: Path) -> None:
        """The fixture's copy of the database: OpenCode leaves most rows in ``opencode.db-wal``
        (it does not checkpoint on exit), and the two files (0.6–2.2 MB, mostly the schema's
        migrations) are over a fixture's size; so a consistent copy through SQLite's backup API,
        the source opened read-only after the CLI exited, switched to a rollback journal so that
        opening the fixture never makes -wal/-shm files beside it. Its rows are what OpenCode's
        own connection reads."""
        import sqlite3

        dest.unlink(missing_ok=True)
        source = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
        copy = sqlite3.connect(dest)
        try:
            source.backup(copy)
            copy.execute("PRAGMA journal_mode = DELETE")
        finally:
            copy.close()
            source.close()


AGENTS = {"claude": Claude, "codex": Codex, "gemini": Gemini, "opencode": OpenCode}
