"""The views' public functions: what the filesystem, the CLI, search and library users call.

Every function takes an open :class:`~memfs.store.session.SessionHandle` and returns the view of
the log as it is now (lazily and incrementally refreshed, see :mod:`memfs.views.cache`).
"""

from __future__ import annotations

import re

import orjson

from memfs.errors import TurnNotFound
from memfs.store.evict import SUMMARY_PREFIX
from memfs.store.paths import DERIVED_DIR, read_file, refuse_symlink
from memfs.views.cache import TURNS_DIR, VIEW_NAMES, state_for
from memfs.views.context import DEFAULT_BUDGET
from memfs.views.memory import summary_names

_TURN_NAME = re.compile(r"([1-9][0-9]*)\.jsonl")
_SUMMARY_NAME = re.compile(re.escape(SUMMARY_PREFIX) + r"[^/\x00]+\.json")


def render_view(handle, name: str) -> bytes:
    """The current bytes of ``derived/<name>``.

    ``name`` is one of :data:`VIEW_NAMES`, ``"turns/<n>.jsonl"`` (the exact bytes of retained
    turn ``n``'s lines; :class:`~memfs.errors.TurnNotFound` when ``n`` is not retained), or a
    stored ``eviction-summary-….json`` (its bytes, never regenerated). Anything else raises
    :class:`FileNotFoundError`.
    """
    if name in VIEW_NAMES:
        return state_for(handle).render(handle, name)
    if name.startswith(TURNS_DIR + "/"):
        m = _TURN_NAME.fullmatch(name[len(TURNS_DIR) + 1:])
        if m is None:
            raise TurnNotFound(f"no such turn view: {name}")
        return _turn_bytes(handle, int(m.group(1)))
    if _SUMMARY_NAME.fullmatch(name):
        refuse_symlink(handle.path / DERIVED_DIR)
        path = handle.path / DERIVED_DIR / name
        if name not in summary_names(handle.path):  # not a regular file: a link, FIFO, directory
            refuse_symlink(path)  # a planted link is refused as such (ELOOP); anything else is absent
            raise FileNotFoundError(f"no such derived view: {name}")
        return read_file(path)
    raise FileNotFoundError(f"no such derived view: {name}")


def _turn_bytes(handle, n: int) -> bytes:
    with handle.reads.hold():  # the range and the bytes from one version of the log: a cap rewrite moves offsets
        start, end, _outcome = handle.turn_range(n)
        data = handle.read_bytes(start, end - start)
        rewrites = handle.rewrites
    state_for(handle).note_turn_written(handle, n, (id(handle.reads.opening), rewrites, start, end), data)
    return data


def list_names(handle) -> list[str]:
    """What ``ls derived/`` shows besides the ``turns/`` directory: the views, then the stored
    eviction summaries (oldest first)."""
    return [*VIEW_NAMES, *summary_names(handle.path)]


def list_turns(handle) -> list[int]:
    """The ordinals of the retained turns (``ls derived/turns``), open turn included."""
    m = handle.manifest
    last = m["turn_count"] + (1 if m["in_turn"] else 0)
    return list(range(m["retained_turn_base"], last + 1))


def memory_facts(handle) -> tuple[list[dict], tuple[int, int]]:
    """The grounded facts of ``memory.json`` and a version key ``(generation, count)``.

    Each fact is ``{"fact", "turn", "offset", "type"}``. A migrated session's imported facts
    come first, with an extra ``imported`` (the imported file's name; mapping in
    :mod:`memfs.views.imported`), also while ``memory.json`` is still the imported file
    verbatim; then facts from eviction summaries, with ``turn`` and ``offset`` null, ``type``
    ``"evicted"`` and an extra ``summary`` (the file name). Within one ``generation`` the list only grows: the first ``count`` facts
    of a later call with the same generation are the same facts, so an index can add just the
    new ones; a new generation (a cap rewrite, a reopen) means start over. The list is a copy;
    the dicts are shared and must not be modified.
    """
    st = state_for(handle)
    with st.lock:
        st.refresh(handle)
        facts = list(st.fold.facts.facts)
        return facts, (st.generation, len(facts))


def memory_view(handle) -> dict:
    """``memory.json`` as a dict."""
    return orjson.loads(render_view(handle, "memory.json"))


def trajectory(handle) -> list[dict]:
    """``trajectory.jsonl`` as a list of dicts, one per retained turn."""
    return [orjson.loads(line) for line in render_view(handle, "trajectory.jsonl").splitlines()]


def progress(handle) -> dict:
    """``progress.json`` (the ProgressLedger) as a dict."""
    return orjson.loads(render_view(handle, "progress.json"))


def goal(handle) -> dict:
    """``goal.json`` (the GoalTracker state) as a dict."""
    return orjson.loads(render_view(handle, "goal.json"))


def summary_markdown(handle) -> str:
    """``summary.md`` as text."""
    return render_view(handle, "summary.md").decode()


def context_markdown(handle, budget: int = DEFAULT_BUDGET) -> str:
    """``context.md`` (see :mod:`memfs.views.context`) in ``budget`` tokens; only the default
    budget's brief is cached and copied to the backing store."""
    if budget == DEFAULT_BUDGET:
        return render_view(handle, "context.md").decode()
    st = state_for(handle)
    with st.lock:
        st.refresh(handle)
        st.refresh_about()
        return st.context(handle, budget)


def progress_markdown(handle) -> str:
    """``progress.md`` as text."""
    return render_view(handle, "progress.md").decode()
