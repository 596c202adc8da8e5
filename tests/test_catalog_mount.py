"""The mount's ``sessions/`` and root search over the store catalog (SPEC §14): a store without
a catalog is listed at once, while its catalog is built, with the attributes a built catalog
gives; another process's new session shows in ``ls`` and in a root search within a deadline."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import uuid
from pathlib import Path

import memfs
from memfs.store.catalog import Catalog, catalog_of

from agent_helpers import MEMFS, cli
from mounting import event, mounted, needs_fuse
from store_helpers import wait_until

pytestmark = needs_fuse

FIXTURES = Path(__file__).parent / "fixtures" / "agents"
CATALOG = Path(".memfs") / "catalog.sqlite"
SEEN_WITHIN = 5.0  # seconds a running mount may take to show another process's new session (a deadline, not a goal)


def turn(*texts: str) -> list[str]:
    return [event("turn.started"),
            *(event("item.completed", item={"id": f"m{i}", "type": "agent_message", "text": t})
              for i, t in enumerate(texts)),
            event("turn.completed", usage={"input_tokens": 3, "output_tokens": 1})]


def make_store(root: Path, sessions: int = 12) -> list[str]:
    """``sessions`` sessions written through memfs, one imported (its times are its records'),
    and folders that are not sessions; the session names, sorted."""
    for i in range(sessions):
        with memfs.open_session(root, f"s{i:02d}", durability="write", metadata_interval=0) as h:
            h.append_many(turn(*(f"note {j} of session {i}" for j in range(i % 3 + 1))))
    done = cli("import", "--store", str(root), str(FIXTURES / "claude" / "ok_failing_command" / "stream.jsonl"))
    assert done.returncode == 0, done.stderr
    (root / "not-a-session").mkdir()  # no log, no manifest
    os.symlink(root / "s01", root / "a-link")  # a symlink is never a session
    return sorted(p.name for p in root.iterdir() if p.name not in ("not-a-session", "a-link")
                  and not p.name.startswith("."))


def is_built(root: Path) -> bool:
    """Whether the store's catalog file is built, as a new reader of it finds it."""
    catalog = Catalog(root)
    try:
        return catalog.ready()
    finally:
        catalog.close()


def listing(mnt: Path) -> dict[str, tuple[int, int, int]]:
    """``sessions/`` as ``ls -l`` sees it: each entry's (mode, size, mtime in ns)."""
    sessions = mnt / "sessions"
    out = {}
    for name in os.listdir(sessions):
        st = os.lstat(sessions / name)
        out[name] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def test_a_store_without_a_catalog_is_listed_while_it_is_built_as_a_built_one_lists_it(tmp_path):
    root, mnt = tmp_path / "store", tmp_path / "mnt"
    names = make_store(root)
    with mounted(root, mnt) as m:
        built = listing(m.mnt)
    assert sorted(built) == names
    assert built["s00"][2] != built["s05"][2]  # (times differ: a comparison that means something)

    # the catalog deleted, and made again empty; another process holds its write lock, so the
    # mount's build of it waits: the listing meanwhile comes from the folders
    for path in (root / ".memfs").iterdir():
        path.unlink()
    assert not is_built(root)
    holder = sqlite3.connect(root / CATALOG, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with mounted(root, mnt) as m:
            during = listing(m.mnt)
            assert not is_built(root)  # (listed while the catalog was not built)
            assert during == built
            holder.execute("ROLLBACK")
            wait_until(lambda: is_built(root), "the mount builds the catalog", timeout=60)
            assert sorted(os.listdir(m.mnt / "sessions")) == names
    finally:
        holder.close()
    with mounted(root, mnt) as m:  # remounted over the catalog just built: the same entries
        assert listing(m.mnt) == built


def test_another_process_s_new_session_shows_in_ls_and_root_search(tmp_path):
    root, mnt = tmp_path / "store", tmp_path / "mnt"
    make_store(root)
    with mounted(root, mnt) as m:
        sessions = m.mnt / "sessions"
        assert (m.mnt / "search" / "note").read_text()  # a running mount: searched and listed before
        assert "fresh" not in os.listdir(sessions)
        token = f"zq{uuid.uuid4().hex[:10]}"
        done = subprocess.run([*MEMFS, "append", "--store", str(root), "fresh"],
                              input="\n".join(turn(f"the {token} landed")) + "\n",
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        wait_until(lambda: "fresh" in os.listdir(sessions), "ls sessions/ shows fresh", timeout=SEEN_WITHIN)
        wait_until(lambda: "fresh:" in (m.mnt / "search" / token).read_text(), "a root search finds fresh",
                   timeout=SEEN_WITHIN)
        st = os.stat(sessions / "fresh")  # its time is its row's
        assert abs(st.st_mtime - catalog_of(root).current(verify=False).row("fresh").updated_ts) < 0.002
