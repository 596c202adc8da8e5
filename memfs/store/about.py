"""What a session is about (SPEC §10 "Session metadata"): agent, conversation, project, title…

One small JSON object per session in ``index/about.json`` (a memfs extension beside the VT
Code-compatible files; VT Code ignores it), replaced atomically. It is written by the ingest
(``memfs record`` / ``memfs import``: what the agent's own record says) and read by the
listing (``memfs sessions``), the views (``summary.md``, ``context.md``) and search filters.

Fields (all optional; unknown fields are kept): ``agent`` (``codex``, ``claude``, ``gemini``,
``vtcode``, or what a native writer names), ``agent_version``, ``conversation_id`` (the agent's
own id: Claude ``sessionId``, Codex thread id, Gemini ``sessionId``), ``title``,
``title_source`` (``agent`` when the agent wrote it, else ``prompt``), ``first_prompt``,
``cwd``, ``project``, ``git_branch``, ``model``, ``parent_session``, ``children`` [names],
``started_at``, ``ended_at``, ``status`` (``running``, ``completed``, ``failed``,
``abandoned``), ``pr_link``, ``forked_from`` and ``forked_at_turn`` (:mod:`memfs.store.fork`), ``turn_notes`` (``{"<turn number>": {"prompt",
"turn_id", "usage", "paired"}}``: what a later capture of the conversation knew of a stored
turn that the stored turn lacks — SPEC §10: metadata, never a duplicate turn — and whether a
failed turn was paired with its other capture; see :mod:`memfs.ingest.identity`),
``item_notes`` (``{"<item id>": {"exit_code", "status"}}``: a stored command's result that a
later capture knew and the first lacked — Gemini CLI's stream-json has no exit code). The
views take the goal from a turn's ``prompt`` note and ``first_prompt`` when the log has none,
and a command's result from its note.

:func:`merge` applies what a capture learnt: the first value stays for what a conversation
has once (``conversation_id``, ``agent``, ``first_prompt``, ``cwd``, ``project``,
``started_at``, ``parent_session``), the latest wins for what moves (``model``,
``git_branch``, ``agent_version``, ``ended_at``, ``status``, ``pr_link``), ``children`` is a
union, ``turn_notes`` and ``item_notes`` are merged per turn or item and field (first
wins), and an agent-written ``title`` replaces one made from the prompt, never the reverse. The caller holds the session's writer lock (the ingest does): merges of one session never race.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson

from memfs.errors import SymlinkRefused
from memfs.store.paths import INDEX_DIR, atomic_write, ensure_private_dir, open_nofollow, read_fd

ABOUT = "index/about.json"
FIRST_WINS = frozenset({"conversation_id", "agent", "first_prompt", "cwd", "project", "started_at",
                        "parent_session", "forked_from"})
NOTES = ("turn_notes", "item_notes")  # merged per entry and field
TITLE_CHARS = 80  # a title made from the first prompt is cut to this many characters


def read(session_dir: Path) -> dict:
    """The session's metadata (``{}`` when it has none, the file does not parse or is not a
    regular file: a symlink is never followed)."""
    try:
        fd = open_nofollow(session_dir / ABOUT, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO never blocks
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return {}
            data = orjson.loads(read_fd(fd))
        finally:
            os.close(fd)
    except (OSError, SymlinkRefused, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def prompt_title(prompt: str) -> str:
    """A title made from a prompt: its first line, whitespace collapsed, cut to
    :data:`TITLE_CHARS` characters (an ellipsis marks a cut)."""
    line = " ".join(prompt.strip().split("\n", 1)[0].split())
    return line if len(line) <= TITLE_CHARS else line[:TITLE_CHARS - 1] + "…"


def merged(old: dict, new: dict) -> dict:
    """``old`` with what ``new`` adds, by the rules of the module docstring (pure)."""
    out = dict(old)
    for key, value in new.items():
        if value is None or value == "" or value == []:
            continue
        if key == "children":
            out[key] = sorted(set(out.get(key) or []) | set(value))
        elif key == "continued_in" and isinstance(value, dict):  # {conversation id: agent} it was resumed as
            out[key] = {**(out.get(key) if isinstance(out.get(key), dict) else {}), **value}
        elif key in NOTES and isinstance(value, dict):
            turns = {n: dict(t) for n, t in (out.get(key) or {}).items() if isinstance(t, dict)}
            for n, fields in value.items():
                if isinstance(fields, dict):
                    for name, v in fields.items():
                        turns.setdefault(str(n), {}).setdefault(name, v)
            out[key] = turns
        elif key in ("title", "title_source"):
            continue  # below
        elif key in FIRST_WINS:
            out.setdefault(key, value)
        else:
            out[key] = value
    title, source = new.get("title"), new.get("title_source") or "agent"
    if not title and new.get("first_prompt") and not out.get("title"):
        title, source = prompt_title(new["first_prompt"]), "prompt"
    if title and (not out.get("title") or source == "agent" or out.get("title_source") == "prompt"):
        if not (source == "prompt" and out.get("title_source") == "agent"):
            out["title"], out["title_source"] = title, source
    return out


def merge(session_dir: Path, new: dict) -> dict:
    """Merge ``new`` into the session's metadata on disk (atomic replace; nothing written when
    nothing changed) and return the result."""
    old = read(session_dir)
    out = merged(old, new)
    if out != old:
        ensure_private_dir(session_dir / INDEX_DIR)
        atomic_write(session_dir / ABOUT, orjson.dumps(out))
        from memfs.store.catalog import noted

        noted(session_dir)  # agent, project, title, record times: the catalog's row
    return out
