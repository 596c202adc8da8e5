"""Migration of a VT Code workspace's legacy stores into sessions (SPEC §7, ``memfs migrate``).

* ``.vtcode/history/<stem>.json`` → session ``<stem>`` whose ``derived/memory.json`` is that
  file, byte for byte;
* ``.vtcode/logs/<stem>.jsonl`` → session ``traj-<stem without a leading "trajectory-">``
  whose ``derived/trajectory.jsonl`` is that file, byte for byte.

The source is also kept verbatim as ``imported/<file name>``: ``derived/`` is rewritten by the
views, so the copy outside it is the import's source of truth — what the views serve and
extend (:mod:`memfs.views.imported`, mapping a name with :func:`imported_view`) and what
guarantees that nothing is lost, even after ``--remove-legacy``.

Each imported session gets an empty ``events.jsonl``, an empty turn index and a
``completed`` manifest whose ``created_at`` and ``updated_at`` are the source file's mtime,
plus ``"imported_from"`` (the source path relative to the workspace; an extra field, which
the format allows) so that retention does not take the import for an empty shell. The
metadata is consistent, so opening the session takes the fast path.

Decisions recorded here:

* A session is assembled in a hidden temporary folder of the sessions root and renamed into
  place, so an interrupted migration never leaves a half-imported session.
* An existing session of the same name is never touched: when its ``imported/`` copy is
  identical the source counts as ``already-imported`` (a re-run is harmless), otherwise it is a
  ``conflict`` and is reported.
* A history file that is not a JSON object is ``invalid`` and skipped. Symlinks (folders or
  files) are never followed; only regular files directly inside the folders are read.
* ``remove_legacy`` deletes the sources that are now in the store (imported or identical),
  then each legacy folder if that left it empty; anything else stays, and is reported.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from memfs.errors import SymlinkRefused
from memfs.store.meta import Manifest, TurnIndex, format_rfc3339
from memfs.store.paths import (
    DERIVED_DIR,
    EVENTS,
    INDEX_DIR,
    MANIFEST,
    TURNS,
    atomic_write,
    ensure_private_dir,
    open_nofollow,
    refuse_symlink,
    remove_file,
    sanitize,
    workspace_root,
)

Progress = Callable[[int, int], None]
LEGACY = {"history": (".json", "memory.json"), "logs": (".jsonl", "trajectory.jsonl")}
IMPORTED_DIR = "imported"


def imported_view(filename: str) -> str | None:
    """The derived view that ``imported/<filename>`` stands for (``"memory.json"`` for a
    ``.json`` history file, ``"trajectory.jsonl"`` for a ``.jsonl`` log), or None."""
    for suffix, view_name in LEGACY.values():
        if filename.endswith(suffix) and len(filename) > len(suffix):
            return view_name
    return None


def session_id_for(folder: str, filename: str) -> str:
    """The naming rules: ``history/<stem>.json`` → ``<stem>``;
    ``logs/<stem>.jsonl`` → ``traj-<stem without a leading "trajectory-">``."""
    stem = filename[: -len(LEGACY[folder][0])]
    if folder == "logs":
        return "traj-" + stem.removeprefix("trajectory-")
    return stem


@dataclass(slots=True)
class Item:
    """One legacy file and what became of it."""

    source: str  # relative to the workspace
    session: str  # session directory name
    kind: str  # "history" | "trajectory"
    status: str  # "imported" | "already-imported" | "conflict" | "invalid"
    reason: str = ""
    bytes: int = 0
    removed: bool = False  # the source was deleted (remove_legacy)


@dataclass(slots=True)
class MigrationReport:
    workspace: str
    root: str
    dry_run: bool
    items: list[Item] = field(default_factory=list)
    removed_folders: list[str] = field(default_factory=list)
    kept_folders: dict[str, str] = field(default_factory=dict)  # folder -> why it stays

    @property
    def imported(self) -> int:
        return sum(1 for i in self.items if i.status == "imported")

    @property
    def failed(self) -> int:
        return sum(1 for i in self.items if i.status in ("conflict", "invalid"))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["imported"] = self.imported
        d["failed"] = self.failed
        return d


def _legacy_files(folder: Path) -> list[tuple[str, os.stat_result]]:
    """Regular files directly in ``folder`` with the folder's suffix, sorted by name."""
    suffix = LEGACY[folder.name][0]
    files = []
    with os.scandir(folder) as it:
        for entry in it:
            if entry.name.endswith(suffix) and len(entry.name) > len(suffix) and entry.is_file(follow_symlinks=False):
                files.append((entry.name, entry.stat(follow_symlinks=False)))
    return sorted(files)


def _read_source(path: Path) -> int:
    return open_nofollow(path, os.O_RDONLY)


def _same_content(a: Path, b: Path) -> bool:
    try:
        fa, fb = _read_source(a), _read_source(b)
    except (OSError, SymlinkRefused):  # no such session file: not the same
        return False
    try:
        if os.fstat(fa).st_size != os.fstat(fb).st_size:
            return False
        while True:
            ca, cb = os.read(fa, 1 << 20), os.read(fb, 1 << 20)
            if ca != cb:
                return False
            if not ca:
                return True
    finally:
        os.close(fa)
        os.close(fb)


def _copy_into(src_fd: int):
    def write(dst: int) -> None:
        while chunk := os.read(src_fd, 1 << 20):
            view = memoryview(chunk)
            while view:
                view = view[os.write(dst, view):]
    return write


def _import(root: Path, source: Path, session_id: str, view_name: str, mtime: float, imported_from: str) -> None:
    """Build the session in a hidden folder of ``root`` and rename it into place."""
    name = sanitize(session_id)
    tmp = root / f".migrate-{name}.{os.getpid()}.{os.urandom(4).hex()}"
    ensure_private_dir(tmp)
    try:
        for sub in (INDEX_DIR, DERIVED_DIR, IMPORTED_DIR):
            ensure_private_dir(tmp / sub)
        os.close(open_nofollow(tmp / EVENTS, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        for target in (tmp / IMPORTED_DIR / source.name, tmp / DERIVED_DIR / view_name):
            src = _read_source(source)
            try:
                atomic_write(target, _copy_into(src))
            finally:
                os.close(src)
        atomic_write(tmp / TURNS, TurnIndex().to_json())
        ts = format_rfc3339(mtime)
        manifest = Manifest(session_id, ts, ts, status="completed").to_dict()
        manifest["imported_from"] = imported_from
        atomic_write(tmp / MANIFEST, orjson.dumps(manifest))
        if os.path.lexists(root / name):
            raise FileExistsError(f"session {name!r} appeared during the migration")
        os.rename(tmp, root / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def migrate_workspace(workspace: str | os.PathLike, root: str | os.PathLike | None = None, *,
                      remove_legacy: bool = False, dry_run: bool = False,
                      progress: Progress | None = None) -> MigrationReport:
    """Import ``workspace``'s legacy history and trajectory files into the sessions root
    ``root`` (default: the workspace's own ``.vtcode/sessions``). See the module docstring."""
    workspace = Path(workspace)
    root = Path(root) if root is not None else workspace_root(workspace)
    report = MigrationReport(str(workspace), str(root), dry_run)
    vtcode = workspace / ".vtcode"
    folders: list[tuple[Path, list]] = []
    for folder_name in LEGACY:
        folder = vtcode / folder_name
        try:
            refuse_symlink(folder)
            if not folder.is_dir():
                continue
            folders.append((folder, _legacy_files(folder)))
        except (OSError, SymlinkRefused) as exc:
            report.kept_folders[str(folder.relative_to(workspace))] = f"not read: {exc}"
    total = sum(len(files) for _, files in folders)
    done = 0
    if total and not dry_run:
        ensure_private_dir(root)
    for folder, files in folders:
        view_name = LEGACY[folder.name][1]
        kind = "history" if folder.name == "history" else "trajectory"
        for filename, st in files:
            if progress:
                progress(done, total)
            done += 1
            source = folder / filename
            rel = f".vtcode/{folder.name}/{filename}"
            session_id = session_id_for(folder.name, filename)
            item = Item(rel, sanitize(session_id), kind, "imported", bytes=st.st_size)
            report.items.append(item)
            if kind == "history" and not _is_json_object(source):
                item.status, item.reason = "invalid", "not a JSON object"
                continue
            target = root / item.session
            if os.path.lexists(target):
                if _same_content(target / IMPORTED_DIR / filename, source):
                    item.status = "already-imported"
                else:
                    item.status, item.reason = "conflict", f"session {item.session!r} already exists"
                continue
            if dry_run:
                continue
            try:
                _import(root, source, session_id, view_name, st.st_mtime, rel)
            except FileExistsError as exc:
                item.status, item.reason = "conflict", str(exc)
    if progress:
        progress(total, total)
    if remove_legacy and not dry_run:
        _remove_legacy(report, workspace, [folder for folder, _ in folders])
    return report


def _is_json_object(path: Path) -> bool:
    fd = _read_source(path)
    try:
        with os.fdopen(fd, "rb") as f:
            return isinstance(orjson.loads(f.read()), dict)
    except orjson.JSONDecodeError:
        return False


def _remove_legacy(report: MigrationReport, workspace: Path, folders: list[Path]) -> None:
    for item in report.items:
        if item.status in ("imported", "already-imported"):
            item.removed = remove_file(workspace / item.source)
    for folder in folders:
        rel = str(folder.relative_to(workspace))
        try:
            os.rmdir(folder)
            report.removed_folders.append(rel)
        except OSError:
            left = len(os.listdir(folder))
            report.kept_folders[rel] = f"{left} entr{'y' if left == 1 else 'ies'} not imported"
