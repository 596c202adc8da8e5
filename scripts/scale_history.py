"""The synthetic history of the scale benchmark (``scripts/bench_scale.py``, SPEC §14).

Everything is made from the captured fixtures (``tests/fixtures/agents/``: Claude Code, Codex,
Gemini CLI), each copy with fresh ids and dates:

* **a store of N sessions**: the fixtures are imported once into a template store by
  ``memfs import`` (so the files are what this tree's import writes); each template session is
  then copied N / 26 times by writing its files directly (``bench_sessions.build_store``), every
  UUID replaced by a fresh one and every timestamp moved to a start spread over the year before
  the build (a session keeps its own span), with a project out of :data:`PROJECTS` in its
  metadata. Ids and timestamps keep their length, so the log's offsets in the manifest and the
  turn index stay right. Per-machine files (the writer's lock, the import's source records, the
  inode-bound agent-id index) are not copied: a reader rebuilds what it needs.
* **agent files to import**: Claude Code transcripts and Codex rollouts, the fixtures' own
  files with fresh ids, dates and project directories, in the layout the agents write.

Stores and sources are cached under a work directory, keyed by their size, :data:`GENERATOR`,
a digest of the template store (what this tree's import writes, ids and times left out) and
the day (so ``--since 1d`` keeps selecting the newest few).
"""

from __future__ import annotations

import calendar
import hashlib
import math
import random
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "agents"
GENERATOR = 1  # bump when what is generated changes: the cached stores are keyed by it
YEAR = 365 * 86400
TOKEN = re.compile(rb"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
                   rb"|(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})")
NOT_COPIED = frozenset(("session.lock", "index/import-sources.json", "index/agent-ids"))
CAPTURE_DIR = re.compile(rb"/tmp/memfs-agent-capture/[a-z]+/[a-z0-9_]+/proj")
PROJECTS = tuple(f"/home/dev/src/{p}" for p in (
    "api-gateway", "billing", "checkout", "dashboard", "data-pipeline", "docs-site", "etl-jobs", "frontend",
    "infra", "inventory", "ledger", "ml-training", "mobile-app", "notifications", "payments", "recommender",
    "search-service", "scheduler", "telemetry", "user-service", "webhooks", "auth", "cli-tools", "sdk"))


class Template:
    """A text cut at its UUIDs and timestamps, to be written again with fresh ones."""

    def __init__(self, data: bytes):
        self.parts: list = []  # bytes, ("u", uuid) or ("t", seconds, fraction digits, zone suffix)
        pos = 0
        for m in TOKEN.finditer(data):
            self.parts.append(data[pos:m.start()])
            if m.group(1):
                self.parts.append(("u", m.group(1)))
            else:
                frac = m.group(3) or b""
                secs = calendar.timegm(time.strptime(m.group(2).decode(), "%Y-%m-%dT%H:%M:%S")) + float(frac or 0)
                self.parts.append(("t", secs, max(len(frac) - 1, 0), m.group(4)))
            pos = m.end()
        self.parts.append(data[pos:])

    def times(self) -> list[float]:
        return [p[1] for p in self.parts if type(p) is tuple and p[0] == "t"]

    def masked(self) -> bytes:
        """The text with its ids and times left out (what the cache key digests, numbers left out too)."""
        return b"".join(p if type(p) is bytes else b"*" for p in self.parts)

    def render(self, ids: Callable[[bytes], bytes], when: Callable[[float], float]) -> bytes:
        out = []
        for p in self.parts:
            if type(p) is bytes:
                out.append(p)
            elif p[0] == "u":
                out.append(ids(p[1]))
            else:
                out.append(stamp(when(p[1]), p[2], p[3]))
        return b"".join(out)


def stamp(secs: float, digits: int, zone: bytes) -> bytes:
    """``secs`` as an ISO timestamp with ``digits`` fraction digits and the zone suffix ``zone``."""
    whole = math.floor(secs)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)).encode()
    if digits:
        text += b".%0*d" % (digits, min(int((secs - whole) * 10 ** digits), 10 ** digits - 1))
    return text + zone


def fresh_ids(key: str, keep: dict[bytes, bytes] | None = None) -> Callable[[bytes], bytes]:
    """A UUID's replacement in the copy ``key`` (the same UUID always gets the same one)."""
    salt = key.encode()

    def ids(u: bytes) -> bytes:
        if keep and u in keep:
            return keep[u]
        h = hashlib.blake2b(u + salt, digest_size=16).hexdigest().encode()
        return b"-".join((h[:8], h[8:12], h[12:16], h[16:20], h[20:32]))
    return ids


def moved(t0: float, span: float, start: float) -> Callable[[float], float]:
    """Times of a copy starting at ``start``: offsets from ``t0`` kept, up to ``span`` (the
    template store's import-time stamps fall at the copy's end)."""
    return lambda secs: start + min(max(secs - t0, 0.0), span)


# --- a store of N sessions ------------------------------------------------------------------------

class Conversation:
    """A template conversation: its sessions (a main one and its sub-agents' ones), each a name
    and its files, and the span of its records."""

    def __init__(self, sessions: list[tuple[Template, dict[str, Template]]]):
        self.sessions = sessions
        times = [t for _, files in sessions for t in files["events.jsonl"].times()] or \
                [t for _, files in sessions for f in files.values() for t in f.times()] or [0.0]
        self.t0, self.span = min(times), max(times) - min(times)


def template_store(work: Path) -> tuple[list[Conversation], str]:
    """Import every fixture into a new template store; its conversations and a digest of what
    the import wrote (ids and times left out)."""
    store = work / "templates"
    shutil.rmtree(store, ignore_errors=True)
    # (Claude, Codex and Gemini: their session names are the ids the copies rewrite; OpenCode's
    # ses_ ids are not UUIDs and would repeat)
    homes = sorted(str(p) for p in FIXTURES.glob("*/*/home") if p.parts[-3] in ("claude", "codex", "gemini"))
    out = subprocess.run([sys.executable, "-m", "memfs", "import", "--store", str(store), *homes], cwd=ROOT,
                         capture_output=True)
    if out.returncode not in (0, 3):  # 3: lines refused (the fixtures hold shapes memfs refuses, as recorded)
        raise RuntimeError(f"import of the fixtures failed: {out.stderr.decode().strip()}")
    digest = hashlib.sha256(str(GENERATOR).encode())
    groups: dict[str, list] = {}
    for d in sorted(p for p in store.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = {}
        for path in sorted(p for p in d.rglob("*") if p.is_file()):
            rel = path.relative_to(d).as_posix()
            if rel not in NOT_COPIED:
                files[rel] = Template(path.read_bytes())
                digest.update(rel.encode() + re.sub(rb"\d+", b"#", files[rel].masked()))  # (numbers vary by run)
        groups.setdefault(d.name.split(".")[0], []).append((Template(d.name.encode()), files))
    shutil.rmtree(store)
    return [Conversation(g) for g in groups.values()], digest.hexdigest()[:12]


def session_maker(conversations: list[Conversation], anchor: float) -> Callable[[int], tuple[str, dict[str, bytes]]]:
    """``files(i)`` for ``bench_sessions.build_store``: session ``i`` of the history, a copy of
    one template session; a conversation's copies share their ids, start and project."""
    schedule = [(c, s) for c, conv in enumerate(conversations) for s in range(len(conv.sessions))]

    def files(i: int) -> tuple[str, dict[str, bytes]]:
        copy, (c, s) = divmod(i, len(schedule))[0], schedule[i % len(schedule)]
        conv = conversations[c]
        rng = random.Random(f"{GENERATOR}/{copy}/{c}")
        when = moved(conv.t0, conv.span, anchor - conv.span - rng.random() * YEAR)
        project = PROJECTS[rng.randrange(len(PROJECTS))]
        ids = fresh_ids(f"{copy}/{c}")
        name, templates = conv.sessions[s]
        out = {}
        for rel, t in templates.items():
            data = t.render(ids, when)
            if rel == "index/about.json":
                about = orjson.loads(data)
                about.update({k: project for k in ("project", "cwd") if k in about})
                data = orjson.dumps(about)
            out[rel] = data
        return name.render(ids, when).decode(), out
    return files


def cached_store(work: Path, n: int) -> tuple[Path, float]:
    """A store of ``n`` sessions, built or found in ``work``; (its path, seconds to build, 0 if found)."""
    from bench_sessions import build_store  # the one writer of generated stores

    work.mkdir(parents=True, exist_ok=True)
    conversations, digest = template_store(work)
    key = f"history-{n}-g{GENERATOR}-{digest}-{time.strftime('%Y%m%d', time.gmtime())}"
    path = work / key
    if path.is_dir():
        return path, 0.0
    for stale in work.glob(f"history-{n}-*"):  # another generator, tree or day
        shutil.rmtree(stale, ignore_errors=True)
    part = work / f"{key}.part"
    built = build_store(part, n, session_maker(conversations, time.time()))
    part.rename(path)
    return path, built


# --- agent files to import ------------------------------------------------------------------------

def source_templates() -> dict[str, list[Path]]:
    """The fixtures' main Claude Code transcripts and Codex rollouts."""
    return {"claude": sorted(FIXTURES.glob("claude/*/home/.claude/projects/*/*.jsonl")),
            "codex": sorted(FIXTURES.glob("codex/*/home/.codex/sessions/*/*/*/rollout-*.jsonl"))}


def source_file(dest: Path, agent: str, template: Path, copy: int, anchor: float, again: int = 0,
                marker: bytes = b"", recent: bool = False) -> Path:
    """Write copy ``copy`` of a fixture source under ``dest`` (``dest/claude/projects/...`` or
    ``dest/codex/sessions/...``), its records within the year before ``anchor`` (``recent``:
    ending at ``anchor``); its path. ``again`` > 0: append the conversation's ``again``-th
    continuation (the same lines with fresh ids but the conversation's own, later; the same
    ``anchor`` finds the same file); ``marker``: a word added after each "README" (something
    to search for)."""
    t = Template(template.read_bytes())
    times = t.times() or [0.0]
    t0, span = min(times), max(times) - min(times)
    rng = random.Random(f"{GENERATOR}/{agent}/{copy}")
    start = anchor - span - (0.0 if recent else rng.random() * YEAR)
    project = PROJECTS[rng.randrange(len(PROJECTS))]
    session = template.stem[-36:].encode()
    new_session = fresh_ids(f"{agent}/{copy}")(session)
    ids = fresh_ids(f"{agent}/{copy}/{again}", {session: new_session})
    data = CAPTURE_DIR.sub(project.encode(), t.render(ids, moved(t0, span, start + again * (span + 60))))
    if marker:
        data = data.replace(b"README", b"README " + marker)
    day = time.gmtime(start)
    if agent == "claude":
        path = dest / "claude" / "projects" / project.replace("/", "-") / f"{new_session.decode()}.jsonl"
    else:
        path = (dest / "codex" / "sessions" / time.strftime("%Y/%m/%d", day) /
                f"rollout-{time.strftime('%Y-%m-%dT%H-%M-%S', day)}-{new_session.decode()}.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(data)
    return path


def cached_sources(work: Path, per_agent: int) -> tuple[Path, float, list[Path]]:
    """``per_agent`` Claude Code transcripts and as many Codex rollouts under ``work``, built or
    found; (their directory, the anchor they were made with, the files: copy ``i`` of agent
    ``a`` is made from ``source_templates()[a][i % len]``)."""
    key = f"sources-{per_agent}-g{GENERATOR}-{time.strftime('%Y%m%d', time.gmtime())}"
    path = work / key
    if not path.is_dir():
        for stale in work.glob(f"sources-{per_agent}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        part = work / f"{key}.part"
        shutil.rmtree(part, ignore_errors=True)
        anchor = time.time()
        for agent, templates in source_templates().items():
            for i in range(per_agent):
                source_file(part, agent, templates[i % len(templates)], i, anchor)
        (part / "anchor").write_text(repr(anchor))
        part.rename(path)
    return path, float((path / "anchor").read_text()), sorted(p for p in path.rglob("*.jsonl"))
