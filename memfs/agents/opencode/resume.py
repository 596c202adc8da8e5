"""``memfs resume SESSION --in opencode`` (:func:`memfs.export.resume.resume_session` hands
it here: :func:`memfs.agents.resumer`). OpenCode keeps a database, not files, so the exported
session goes in through ``opencode import`` and the new turns come back from the database."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson

from memfs.agents.opencode import read as opencode
from memfs.agents.opencode.store import DB_NAME
from memfs.export import ExportError, export_session
from memfs.export.resume import Resumed, run_passthrough, session_cwd
from memfs.ingest import conversations
from memfs.ingest.importer import read_sources, write_sources
from memfs.ingest.record import check_runnable
from memfs.store import about
from memfs.store.session import open_session


def resume(root: Path, session: str, args: Sequence[str], home, max_events: int, chosen: str | None,
           tell: Callable[[str], None] | None) -> Resumed:
    """OpenCode keeps a database, not files: the session is exported to a file that ``opencode
    import`` writes into it (once: the OpenCode session's id is remembered in the session's
    ``index/import-sources.json``, with the user messages that were exported), the tool runs
    ``opencode run --session ID ARGS`` (no ARGS: its TUI, ``opencode --session ID``), and the
    turns it added come back from its database into this session
    (:func:`memfs.agents.opencode.read.import_store` with ``into``), the exported ones left out."""
    with open_session(root, session, read_only=True) as handle:
        check_runnable("opencode")
        name = handle.name
        here, origin = (chosen, "--cwd") if chosen is not None else session_cwd(about.read(handle.path).get("cwd"))
        sid = opencode.resumed_as(Path(handle.path))
        if sid is None:
            with tempfile.TemporaryDirectory(prefix="memfs-opencode-") as tmp:
                exported = export_session(handle, "opencode", Path(tmp), home=Path(home) if home else None, cwd=here)
                sid = exported.conversation_id
                skip = [m["info"]["id"] for m in orjson.loads(Path(exported.path).read_bytes())["messages"]
                        if m["info"]["role"] == "user"]
                done = subprocess.run(exported.argv, cwd=here, stdin=subprocess.DEVNULL, capture_output=True)
                if done.returncode != 0:
                    why = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()
                    raise ExportError(f"resume: opencode import failed ({done.returncode}): "
                                       f"{why[-1] if why else 'no output'}")
            sources = read_sources(handle.path)
            sources[opencode.RESUMED] = {"session": sid}
            sources[f"opencode:{sid}"] = {"skip": skip, "open_turn": None}
            write_sources(handle.path, sources)
            about.merge(Path(handle.path), {"continued_in": {sid: "opencode"}})  # (a plain import of
            conversations.register(root, sid, "opencode", name)  # OpenCode's store comes here too)
    if tell is not None:
        tell(f"memfs resume: opencode runs in {here} ({origin})")
    argv = ["opencode", "run", "--session", sid, *args] if args else ["opencode", "--session", sid]
    result = Resumed(name, sid, argv, run_passthrough(argv, here))
    data = Path(os.environ.get("XDG_DATA_HOME") or Path(home or Path.home()) / ".local" / "share")
    try:
        items = opencode.import_store(root, data / "opencode" / DB_NAME, only=sid, into=name, max_events=max_events)
    except Exception as exc:  # (the tool's work is in its own database: say so, keep its status)
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    for item in items:
        result.appended, result.duplicates, result.refused = item.appended, item.duplicates, item.refused
        if item.status == "error":
            result.error = item.reason or item.status
    if not items:
        result.error = f"OpenCode's database holds no session {sid}"
    return result
