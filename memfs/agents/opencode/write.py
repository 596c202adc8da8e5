"""A conversation as an OpenCode session file (SPEC §11): what ``opencode import FILE`` reads —
the shape ``opencode export`` writes (OpenCode 1.18.33): ``{"info": session, "messages":
[{"info": message, "parts": [part, …]}, …]}`` — so that ``opencode run --session ID`` continues
it. Read back by :mod:`memfs.agents.opencode.read` once OpenCode wrote it into its database.

Per turn: a user message (its prompt as a ``text`` part) and the assistant messages answering
it (``parentID``; a new one after each run of tool calls, as OpenCode writes one per request,
so the model sees the turn in its order), holding the turn's texts as ``text`` parts and its
commands as ``bash`` ``tool`` parts (``state``: the command, its output, ``metadata.exit``); what OpenCode has no part for is
folded into text (:func:`memfs.agents.common.fold_text`); a failed turn's assistant message
carries the failure as its ``error``. Its tokens are the turn's usage in OpenCode's disjoint
form. Ids are OpenCode's: ``ses_``/``msg_``/``prt_`` and 26 characters, message and part ids
ascending in time as OpenCode's are (it orders by them), derived from the session so that a
second export of it gives the same ids. ``provider``/``model``: what the target OpenCode runs
(its config's ``model``, ``provider/model``), since it continues with the provider of the last
user message.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import orjson

from memfs.agents.common import NO_RESULT, fold_text, ms_of, native_usage
from memfs.agents.opencode.shapes import SHAPES
from memfs.export import ExportError, Placement, out_file
from memfs.export.conversation import Clock, Conversation, parse_time

VERSION = "1.18.33"  # the OpenCode version these shapes were checked against
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _tail(seed: str, n: int = 14) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(_B62[b % 62] for b in digest[:n])


def session_id(conv: Conversation) -> str:
    """The OpenCode session id, derived from the memfs session's name — never the id of the
    OpenCode session it may have come from, which ``opencode import`` would meet in the store
    that already holds it."""
    return "ses_" + hashlib.sha256(conv.name.encode()).hexdigest()[:12] + _tail(conv.name)


def _ms(text: Any) -> int:
    value = ms_of(text)
    assert value is not None
    return value


class _Writer:
    def __init__(self, conv: Conversation, cwd: str, provider: str, model: str) -> None:
        self.conv, self.cwd, self.provider, self.model = conv, cwd, provider, model
        self.sid = session_id(conv)
        first = next((t.started_at for t in conv.turns if t.started_at), None)
        self.clock = Clock(parse_time(first) or parse_time(conv.about.get("started_at")))
        self.counter = 0
        self.messages: list[dict] = []

    def _id(self, prefix: str, ms: int) -> str:
        """An ascending id as OpenCode makes them: 12 hex digits of time·4096 + a counter, then
        14 base-62 characters."""
        self.counter += 1
        return f"{prefix}_{(ms * 0x1000 + self.counter % 0x1000) & 0xFFFFFFFFFFFF:012x}" + _tail(
            f"{self.sid}:{prefix}:{self.counter}")

    def _part(self, message: dict, ms: int, **data: Any) -> dict:
        part = {**data, "id": self._id("prt", ms), "sessionID": self.sid, "messageID": message["info"]["id"]}
        message["parts"].append(part)
        return part

    def _message(self, ms: int, **info: Any) -> dict:
        message = {"info": {**info, "id": self._id("msg", ms), "sessionID": self.sid}, "parts": []}
        self.messages.append(message)
        return message

    def turn(self, turn) -> None:
        start = _ms(self.clock.at(turn.started_at))
        model = {"providerID": self.provider, "modelID": self.model}
        user = self._message(start, role="user", time={"created": start}, agent="build", model=model)
        self._part(user, start, type="text", text=turn.prompt or "(no prompt recorded)")
        begun = _ms(self.clock.at())
        tokens = native_usage(SHAPES.usage, turn.disjoint_usage())
        zero = native_usage(SHAPES.usage, {})

        def assistant(ms: int) -> dict:
            return self._message(ms, parentID=user["info"]["id"], role="assistant", mode="build", agent="build",
                                 path={"cwd": self.cwd, "root": self.cwd}, cost=0, tokens=zero,
                                 modelID=self.model, providerID=self.provider, time={"created": ms})

        answer, after_tool = assistant(begun), False
        for item in turn.items:
            at = _ms(self.clock.at())
            kind = item.get("type")
            if after_tool and kind != "command_execution":  # the model's next step: a message of its own,
                answer["info"].update(finish="tool-calls")  # as OpenCode writes one per request
                answer["info"]["time"]["completed"] = at
                answer, after_tool = assistant(_ms(self.clock.at())), False
                at = _ms(self.clock.at())
            if kind == "agent_message" and isinstance(item.get("text"), str):
                self._part(answer, at, type="text", text=item["text"], time={"start": at, "end": at})
            elif kind == "command_execution":
                output = item.get("aggregated_output") if isinstance(item.get("aggregated_output"), str) else None
                exit_code = item.get("exit_code") if type(item.get("exit_code")) is int else None
                command = str(item.get("command") or "")
                text = output if output is not None else NO_RESULT
                self._part(answer, at, type="tool", tool=SHAPES.writes["command_execution"], callID=f"call_{self.counter}", state={
                    "status": "completed", "input": {"command": command, "description": command[:60]},
                    "output": text, "title": command,
                    "metadata": {"output": text, "exit": exit_code, "description": command[:60], "truncated": False},
                    "time": {"start": at, "end": at}})
                after_tool = True
            else:
                text = fold_text(item) or orjson.dumps(item).decode()
                self._part(answer, at, type="text", text=text, time={"start": at, "end": at})
        end = _ms(self.clock.at(turn.completed_at))
        answer["info"]["time"]["completed"] = end
        answer["info"]["tokens"] = tokens  # the turn's usage, on its last request
        if turn.outcome == "failed":
            answer["info"]["error"] = {"name": "UnknownError", "data": {"message": turn.failure or "failed"}}
        else:
            answer["info"]["finish"] = "stop"


def render(conv: Conversation, cwd: str, provider: str | None = None, model: str | None = None) -> dict:
    """The file ``opencode import`` reads, for ``conv`` continued in ``cwd``."""
    w = _Writer(conv, cwd, provider or "opencode", model or conv.model or "default")
    for turn in conv.turns:
        w.turn(turn)
    created = w.messages[0]["info"]["time"]["created"] if w.messages else _ms(w.clock.at())
    updated = max((m["info"]["time"].get("completed", m["info"]["time"]["created"]) for m in w.messages),
                  default=created)
    title = conv.about.get("title") if isinstance(conv.about.get("title"), str) else conv.name
    info = {"id": w.sid, "slug": conv.name[:40], "projectID": "global", "directory": cwd, "path": "",
            "title": title, "version": VERSION, "time": {"created": created, "updated": updated}}
    return {"info": info, "messages": w.messages}


def target_model(config_dir) -> tuple[str | None, str | None]:
    """``(provider, model)`` of the OpenCode configured in ``config_dir`` (its ``opencode.json``
    ``model``, ``provider/model``), or ``(None, None)``."""
    from pathlib import Path

    for name in ("opencode.json", "opencode.jsonc", "config.json"):
        try:
            doc = orjson.loads((Path(config_dir) / name).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        model = doc.get("model") if isinstance(doc, dict) else None
        if isinstance(model, str) and "/" in model:
            provider, _, name_ = model.partition("/")
            return provider, name_
    return None, None


def place(conv: Conversation, out: Path | None, home: Path | None, cwd: str) -> Placement:
    """Where the file goes (:class:`memfs.export.Placement`): ``opencode import FILE`` reads a
    file anywhere, so ``out`` (a file, or a directory for ``<session id>.json``) is needed. The
    provider and model are the target OpenCode's (its config under ``home``, default
    ``$XDG_CONFIG_HOME`` or ``~/.config``)."""
    if out is None:
        raise ExportError("export: --to opencode needs --out (a file or a directory); then `opencode import FILE`")
    base = Path(home) / ".config" if home is not None else Path(os.environ.get("XDG_CONFIG_HOME") or
                                                              Path.home() / ".config")
    provider, model = target_model(base / "opencode")
    doc = render(conv, cwd, provider, model)
    sid = doc["info"]["id"]
    path = out_file(out, f"{sid}.json")
    return Placement(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n", sid, ["opencode", "import", str(path)])
