"""What a file change changed (issue 53): the ``diff`` or ``content`` a ``file_change`` item's
change carries beside its ``path`` and ``kind``, from each agent's record. Pure.

* ``diff``: a unified diff (``--- a/PATH`` / ``+++ b/PATH``, an absolute path as it is, and hunks): Claude Code's
  Edit/MultiEdit (``old_string`` → ``new_string``, by :mod:`difflib`: hunk line numbers count
  from the edited text, not the file), a Codex ``apply_patch`` section or ``patch_apply_end``
  ``unified_diff``, Gemini CLI's ``fileDiff``.
* ``content``: what was written when no diff is recorded: Claude Code's Write, a Codex added
  file, Gemini's ``write_file`` without a ``fileDiff``.

Both are cut to their first and last 2 KiB (:func:`memfs.facts.bounded_output`), as tool
outputs are; a change without either is only its path and kind.
"""

from __future__ import annotations

import difflib
from typing import Any

from memfs.facts import bounded_output


def _headers(path: str, to: str | None = None) -> str:
    """A diff's ``---``/``+++`` lines: ``a/PATH`` and ``b/PATH``, an absolute path as it is."""
    return "".join(f"{mark} {p if p.startswith('/') else side + p}\n"
                   for mark, side, p in (("---", "a/", path), ("+++", "b/", to or path)))


def text_diff(path: str, old: str, new: str) -> str:
    """The unified diff of ``old`` → ``new`` under :func:`_headers` (empty: no change)."""
    lines = list(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), n=3))
    if not lines:
        return ""
    lines[:2] = [_headers(path)]
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def described(change: dict, diff: str | None = None, content: str | None = None) -> dict:
    """``change`` with its ``diff`` (else ``content``) when there is one, bounded."""
    if diff:
        change["diff"] = bounded_output(diff)
    elif isinstance(content, str):
        change["content"] = bounded_output(content)
    return change


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def claude_change(change: dict, name: str, args: dict) -> dict:
    """A Claude Code Edit/MultiEdit/Write call's change, from its input (``old_string``,
    ``new_string``, ``edits``, ``content``)."""
    path = change["path"]
    if name == "Edit":
        return described(change, text_diff(path, _str(args.get("old_string")), _str(args.get("new_string"))))
    if name == "MultiEdit":
        edits = args.get("edits") if isinstance(args.get("edits"), list) else []
        return described(change, "".join(text_diff(path, _str(e.get("old_string")), _str(e.get("new_string")))
                                         for e in edits if isinstance(e, dict)))
    if name == "Write":
        return described(change, content=_str(args.get("content")))
    return change


def patch_changes(patch: str) -> list[dict]:
    """The files a Codex ``apply_patch`` input names (``*** Add/Update/Delete File:``), each with
    its section: an update's hunks as a diff, an added file's lines as its content."""
    changes: list[dict] = []
    body: list[str] = []

    def close() -> None:
        if changes:
            last = changes[-1]
            if last["kind"] == "update" and body:
                moved = next((b[len("*** Move to: "):].strip() for b in body if b.startswith("*** Move to: ")),
                             last["path"])
                hunks = [b for b in body if not b.startswith("*** ")]
                described(last, _headers(last["path"], moved) + "".join(h + "\n" for h in hunks))
            elif last["kind"] == "add":
                described(last, content="".join(b[1:] + "\n" for b in body if b.startswith("+")))
        body.clear()

    for line in patch.splitlines():
        for prefix, kind in (("*** Add File: ", "add"), ("*** Update File: ", "update"),
                             ("*** Delete File: ", "delete")):
            if line.startswith(prefix):
                close()
                changes.append({"path": line[len(prefix):].strip(), "kind": kind})
                break
        else:
            if changes and line != "*** End Patch":
                body.append(line)
    close()
    return changes


def event_changes(changes: Any) -> list[dict]:
    """A Codex ``patch_apply_end``/``FileChange`` ``changes`` map (``{path: {type, unified_diff
    | content}}``) as changes."""
    out = []
    if isinstance(changes, dict):
        for path, change in changes.items():
            change = change if isinstance(change, dict) else {}
            ctype = change.get("type")
            kind = ctype if ctype in ("add", "delete", "update") else "update"
            diff = change.get("unified_diff")
            if isinstance(diff, str) and diff and not diff.startswith("--- "):
                moved = change.get("move_path") if isinstance(change.get("move_path"), str) else path
                diff = _headers(str(path), str(moved)) + diff
            out.append(described({"path": str(path), "kind": kind}, diff if isinstance(diff, str) else None,
                                 change.get("content") if kind == "add" else None))
    return out


def gemini_change(change: dict, args: dict, display: Any) -> dict:
    """A Gemini CLI ``replace``/``write_file`` call's change: its ``fileDiff``, else the diff of
    ``old_string`` → ``new_string``, else the written ``content``."""
    diff = display.get("fileDiff") if isinstance(display, dict) else None
    if isinstance(diff, str) and diff:
        return described(change, diff)
    if isinstance(args.get("old_string"), str) or isinstance(args.get("new_string"), str):
        return described(change, text_diff(change["path"], _str(args.get("old_string")),
                                           _str(args.get("new_string"))))
    return described(change, content=args.get("content") if isinstance(args.get("content"), str) else None)
