"""Claude Code tool calls → items (SPEC §10): which item a call becomes, and how its result
completes it. Used by :mod:`memfs.agents.claude.read`; pure (a side file is read only through the
reader a runner passes in).

Every item's ``id`` is the call's ``tool_use.id``; the result completes that same item
(``item.completed`` with the same id), so a call is recorded the same way whether it was read
from ``stream-json`` or from the transcript.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from memfs.agents import common
from memfs.agents.changes import claude_change
from memfs.agents.claude.shapes import SHAPES
from memfs.agents.common import REASONING, fold_text  # noqa: F401  (the writer's and reader's names)
from memfs.ingest import bounded_output, child_session_name, text_of

_CREATED = re.compile(r"Task #([A-Za-z0-9_-]{1,64}) created")
_PERSISTED = re.compile(r"Full output saved to: ([^\n]+)")
_SAFE_ID = re.compile(r"\A[A-Za-z0-9_-]{1,128}\Z")
_SAFE_NAME = re.compile(r"\A[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}\Z")


def kind_of(name: str) -> str:
    """The item kind of a tool call by the tool's name (:data:`SHAPES`)."""
    return common.kind_of(SHAPES, name)


def call_item(kind: str, tid: str, name: str, args: dict, status: str) -> dict:
    """The item a call of tool ``name`` with ``args`` is, in ``status``."""
    if kind == "command_execution":
        command = args.get("command")
        return {"id": tid, "type": kind, "command": command if isinstance(command, str) else str(command),
                "status": status}
    if kind == "file_change":
        path = args.get("file_path") or args.get("notebook_path") or args.get("path") or ""
        return {"id": tid, "type": kind, "changes": [{"path": str(path), "kind": "update"}], "status": status}
    if kind == "mcp_tool_call":
        server, _, tool = name[len(SHAPES.mcp_prefix or ""):].partition("__")
        return {"id": tid, "type": kind, "tool_name": name, "server": server, "tool": tool or server,
                "arguments": args, "status": status}
    if kind == "web_search":
        query = args.get("query") if name == "WebSearch" else args.get("url")
        item: dict[str, Any] = {"id": tid, "type": kind, "query": query if isinstance(query, str) else ""}
        if name == "WebFetch":
            item["action"] = {"type": "open_page", "url": item["query"]}
        return item
    if kind == "todo_list":
        todos = args.get("todos") if isinstance(args.get("todos"), list) else []
        return todo_item(tid, [{"subject": t.get("content", ""), "status": t.get("status")}
                               for t in todos if isinstance(t, dict)])
    return {"id": tid, "type": "tool_invocation", "tool_name": name, "status": status, "arguments": args}


def todo_item(tid: str, tasks: list[dict]) -> dict:
    """A ``todo_list`` item holding the whole list (``[{subject, status}]``)."""
    return {"id": tid, "type": "todo_list", "items": [
        {"text": str(t.get("subject", "")), "completed": t.get("status") == "completed"} for t in tasks]}


def apply_task(tasks: list[dict], name: str, args: dict, output: str, extra: Any) -> bool:
    """Apply a successful ``TaskCreate``/``TaskUpdate`` to ``tasks`` (``[{id, subject,
    status}]``, in creation order); True when the list changed."""
    if name == "TaskCreate":
        task = extra.get("task") if isinstance(extra, dict) else None
        tid = task.get("id") if isinstance(task, dict) else None
        if not isinstance(tid, str):
            m = _CREATED.search(output)
            tid = m.group(1) if m else str(len(tasks) + 1)
        subject = args.get("subject")
        tasks.append({"id": tid, "subject": subject if isinstance(subject, str) else "",
                      "status": "pending"})
        return True
    tid = args.get("taskId")
    for i, task in enumerate(tasks):
        if task["id"] == str(tid):
            status = args.get("status")
            if status == "deleted":
                del tasks[i]
                return True
            if isinstance(status, str):
                task["status"] = status
            if isinstance(args.get("subject"), str):
                task["subject"] = args["subject"]
            return True
    return False


def persisted_file(output: str, session_id: str | None) -> str | None:
    """The side file (``<session>/tool-results/<name>``, relative to the transcript's directory)
    that a ``<persisted-output>`` result names, or None (not one, or naming anything else)."""
    if not output.startswith("<persisted-output>") or not session_id:
        return None
    m = _PERSISTED.search(output)
    if not m:
        return None
    parts = m.group(1).strip().replace("\\", "/").split("/")
    if len(parts) < 3 or parts[-3] != session_id or parts[-2] != "tool-results" or not _SAFE_NAME.match(parts[-1]):
        return None
    return f"{session_id}/tool-results/{parts[-1]}"


def result_output(block: dict, extra: Any, session_id: str | None,
                  reader: Callable[[str], str | None] | None) -> str:
    """A tool result's output text: a persisted output read from its ``tool-results/`` file
    (through ``reader``), else the record's full ``stdout``/``stderr``, else the result's text."""
    output = text_of(block.get("content"))
    side = persisted_file(output, session_id)
    if side is not None:
        if reader is not None:
            text = reader(side)
            if text is not None:
                return text
        if isinstance(extra, dict) and isinstance(extra.get("stdout"), str):
            stderr = extra.get("stderr")
            return extra["stdout"] + (f"\n{stderr}" if isinstance(stderr, str) and stderr else "")
    return output


def child_session(parent: str | None, agent_id: Any) -> str | None:
    """The child session's name for sub-agent ``agent_id`` of conversation ``parent``
    (``<parent>.agent-<id>``, as the importer names a sub-agent file), or None when either
    is not a safe id."""
    if not isinstance(agent_id, str) or not _SAFE_ID.match(agent_id):
        return None
    return child_session_name(parent, f"agent-{agent_id}")


def result_item(call: dict, tid: str, block: dict, extra: Any, output: str) -> dict:
    """The completed item of call ``call`` (``{name, input}``) given its result ``block``."""
    name, args = call["name"], call["input"]
    kind = kind_of(name)
    failed = block.get("is_error") is True
    status = "failed" if failed else "completed"
    item = call_item(kind, tid, name, args, status)
    if kind == "command_execution":
        code = common.exit_code(SHAPES, output)
        interrupted = isinstance(extra, dict) and extra.get("interrupted") is True
        if code is not None:
            item["exit_code"] = code
        elif not failed and not interrupted:
            item["exit_code"] = 0
        if interrupted:
            item["status"] = "failed"
        item["aggregated_output"] = bounded_output(output)
    elif kind == "file_change":
        if name == "Write" and isinstance(extra, dict) and extra.get("type") == "create":
            item["changes"][0]["kind"] = "add"
        claude_change(item["changes"][0], name, args)
    elif kind == "mcp_tool_call":
        item["result"], item["error"] = common.mcp_outcome(output, failed, block.get("content"))
    elif kind == "web_search":
        pass
    else:
        item["output"] = bounded_output(output)
    return item


FOLDED = "memfs"  # a transcript line's key naming the blocks an export folded into text (SPEC §11)
def fold_mark(folded: dict[int, dict]) -> dict:
    """The mark of an assistant line whose blocks ``{index: item}`` are folded items: reasoning
    by index only (its text is the block's), any other item whole but its id."""
    mark: dict = {}
    for k, item in folded.items():
        if item.get("type") == "reasoning":
            mark.setdefault("reasoning", []).append(k)
        else:
            mark.setdefault("items", {})[str(k)] = {key: v for key, v in item.items() if key != "id"}
    return mark


def unfold(line: dict, blocks: list) -> dict[int, dict]:
    """The items (without ids) that an export folded into ``blocks`` (an assistant line's
    content), by block index: named in the line's mark and, for each, a text block that is
    exactly what :func:`fold_text` makes of it — the mark decides, never the words alone."""
    mark = line.get(FOLDED)
    folded = mark.get("folded") if isinstance(mark, dict) else None
    if not isinstance(folded, dict):
        return {}

    def text(k: Any) -> str | None:
        block = blocks[k] if type(k) is int and 0 <= k < len(blocks) else None
        ok = isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)
        return block["text"] if ok else None  # type: ignore[index]

    out: dict[int, dict] = {}
    reasoning = folded.get("reasoning")
    for k in reasoning if isinstance(reasoning, list) else []:
        said = text(k)
        if said is not None and said.startswith(REASONING):
            out[k] = {"type": "reasoning", "text": said[len(REASONING):]}
    items = folded.get("items")
    for key, item in items.items() if isinstance(items, dict) else []:
        k = int(key) if isinstance(key, str) and key.isdigit() and len(key) < 6 else None
        said = text(k)
        if said is not None and isinstance(item, dict) and item.get("type") not in (None, "reasoning", "agent_message") \
                and fold_text(item) == said:
            out[k] = {key: v for key, v in item.items() if key != "id"}  # type: ignore[index]
    return out
