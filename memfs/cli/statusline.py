"""``memfs statusline``: one line for Claude Code's ``statusLine`` (SPEC §12).

Claude Code runs the command at each redraw with a JSON object on stdin (``session_id``,
``transcript_path``, ``model.display_name``, ``workspace.current_dir``, ``cost.total_cost_usd``,
``context_window.current_usage``, …); this prints::

    Opus | session $0.53 | today $4.21 | block $2.10, 3h12m left | ctx 45,123

* session: this conversation's cost as memfs computed it (the store's session of that id),
  else Claude Code's own ``cost.total_cost_usd`` (``(claude)``);
* today: the store's turns of the local day; block: the active billing block
  (:mod:`memfs.usage.windows`) and its time left;
* ctx: the context's tokens, from ``context_window.current_usage``, else the last assistant
  message's usage in the transcript's tail;
* a cost with a ``*`` is the priced part (a model without a price took part).

Fast, since it runs at every redraw: loaded alone (``memfs.cli.main`` dispatches to it before
building the parser) and reading the store-level usage index (``.usage-index.json``) with
two ``lstat`` per session to check it is current; only when it is not (or missing) are the
usage modules loaded to redo the stale entries (:func:`memfs.usage.reporting.contributions`),
which also rewrites the index for the next redraw. A missing or unreadable store still prints
the line from stdin alone. Options: ``--store DIR``/``--workspace DIR``/``--config FILE`` as
every command (the config file is read for ``store``/``workspace`` and ``[prices]`` only).
"""

from __future__ import annotations

import os
import sys
import time

import orjson

TAIL = 256 * 1024  # bytes of the transcript read back for the last usage


def run(argv: list[str]) -> int:
    opts = _options(argv)
    if opts is None:
        return 2
    try:
        data = orjson.loads(sys.stdin.buffer.read() or b"{}")
    except orjson.JSONDecodeError as exc:
        print(f"memfs: statusline: stdin is not JSON: {exc}", file=sys.stderr)
        return 1
    if type(data) is not dict:
        data = {}
    sys.stdout.write(line(data, opts) + "\n")
    return 0


def _options(argv: list[str]) -> dict | None:
    opts: dict = {}
    it = iter(argv)
    for arg in it:
        if arg in ("-h", "--help"):
            print("usage: memfs statusline [--store DIR | --workspace DIR] [--config FILE] < statusLine JSON\n\n"
                  + (__doc__ or "").split("\n\n")[0])
            return None
        key = arg.lstrip("-")
        if arg.startswith("--") and "=" in key:
            key, value = key.split("=", 1)
        elif arg in ("--store", "--workspace", "--config"):
            value = next(it, None)
        else:
            print(f"memfs: statusline: unknown argument {arg!r}", file=sys.stderr)
            return None
        if value is None or key not in ("store", "workspace", "config"):
            print(f"memfs: statusline: {arg} needs a value", file=sys.stderr)
            return None
        opts[key] = value
    return opts


def line(data: dict, opts: dict) -> str:
    model = _get(data, "model", "display_name") or _get(data, "model", "id") or "?"
    parts = [str(model)]
    uses = _uses(opts)
    sid = data.get("session_id")
    now = time.time()
    mine = uses.get(sid) if type(sid) is str else None
    if mine:
        parts.append("session " + _cost(mine))
    else:
        own = _get(data, "cost", "total_cost_usd")
        parts.append(f"session {_usd(own)} (claude)" if type(own) in (int, float) else "session -")
    everything = sorted((u for us in uses.values() for u in us), key=lambda u: u[0])
    today = time.strftime("%Y-%m-%d", time.localtime(now))
    parts.append("today " + _cost([u for u in everything if time.strftime("%Y-%m-%d", time.localtime(u[0])) == today]))
    parts.append(_block(everything, now))
    ctx = _context(data)
    if ctx is not None:
        size = _get(data, "context_window", "context_window_size")
        share = f" ({100 * ctx / size:.0f}%)" if type(size) is int and size > 0 else ""
        parts.append(f"ctx {ctx:,}{share}")
    return " | ".join(parts)


def _get(data: dict, *keys: str):
    for key in keys:
        if type(data) is not dict:
            return None
        data = data.get(key)
    return data


def _usd(value: float) -> str:
    return f"${value:,.2f}"


def _cost(uses: list) -> str:
    """The sum of ``[at, model, tokens, cost, reason, refused]`` uses' costs (``*``: priced part)."""
    priced = [u[3] for u in uses if u[3] is not None]
    if uses and not priced:
        return "-"
    return _usd(sum(priced)) + ("*" if len(priced) < len(uses) else "")


def _block(uses: list, now: float) -> str:
    from memfs.usage.windows import BLOCK, active, split

    times = [u[0] for u in uses]
    for start, first, stop, gap in reversed(split(times)):
        if not gap:
            if active(start, times[stop - 1], now):
                left = int(start + BLOCK - now) // 60
                return f"block {_cost(uses[first:stop])}, {left // 60}h{left % 60:02d}m left"
            break
    return "no active block"


def _context(data: dict) -> int | None:
    usage = _get(data, "context_window", "current_usage")
    if type(usage) is not dict:
        usage = _transcript_usage(data.get("transcript_path"))
    if type(usage) is not dict:
        return None
    from memfs.counts import read

    counts, refused = read(usage, ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
    return None if refused is not None else sum(counts)


def _transcript_usage(path) -> dict | None:
    """The usage of the last assistant message in the transcript's last :data:`TAIL` bytes."""
    if type(path) is not str:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - TAIL))
            lines = f.read().splitlines()
    except OSError:
        return None
    for raw in reversed(lines):
        if b'"usage"' not in raw:
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        usage = _get(obj, "message", "usage")
        if type(obj) is dict and obj.get("type") == "assistant" and type(usage) is dict:
            return usage
    return None


# --- the store's usage ------------------------------------------------------------------------


def _root(opts: dict):
    from pathlib import Path

    from memfs.store.paths import config_path, default_root, workspace_root

    if "store" in opts:
        return Path(opts["store"])
    if "workspace" in opts:
        return workspace_root(Path(opts["workspace"]))
    path = config_path(opts.get("config"))
    settings = _config_file(path) if path is not None else {}
    for key in ("store", "workspace"):
        value = settings.get(key)
        if type(value) is str:
            where = (path.parent / os.path.expanduser(value)) if path is not None else Path(value)
            return where if key == "store" else workspace_root(where)
    return default_root()


def _config_file(path) -> dict:
    import tomllib

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _uses(opts: dict) -> dict[str, list]:
    """``{session: [[at, model, tokens, cost, reason, refused], …]}`` of the store (empty: none)."""
    try:
        root = _root(opts)
        fast = _index(root, opts)
        if fast is not None:
            return fast
        from memfs.usage.reporting import contributions

        _configure(opts)
        return {name: [[u.at, u.model, u.tokens, u.cost, u.reason, u.refused] for u in c.uses]
                for name, c in contributions(root).items()}
    except Exception:  # noqa: BLE001 — a status line never fails: it shows what it has
        return {}


def _configure(opts: dict) -> None:
    from memfs.config import load_config
    from memfs.store.paths import config_path
    from memfs.usage import prices

    path = config_path(opts.get("config"))
    if path is not None:
        prices.configure(load_config(path).prices)


def _index(root, opts: dict) -> dict[str, list] | None:
    """The index's uses when every entry is current and it was made with the prices in force."""
    from memfs.usage import INDEX_FORMAT, VIEW_VERSION

    try:
        with open(os.path.join(root, ".usage-index.json"), "rb") as f:
            data = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        return None
    key = data.get("key") if type(data) is dict else None
    if type(key) is not list or len(key) != 3 or key[:2] != [VIEW_VERSION, INDEX_FORMAT] or not _same_prices(key[2], opts):
        return None
    sessions = data.get("sessions")
    if type(sessions) is not dict:
        return None
    out = {}
    top = os.fspath(root)
    for name, entry in sessions.items():
        if _stamp(f"{top}/{name}") != [entry[0], entry[1]]:
            return None
        out[name] = entry[5]
    try:  # a session the index does not know yet
        for e in os.scandir(top):
            if e.name not in sessions and not e.name.startswith(".") and os.path.exists(
                    os.path.join(e.path, "events.jsonl")):
                return None
    except OSError:
        return None
    return out


def _stamp(d: str) -> list:
    """What :func:`memfs.usage.reporting.stamp_now` says of a session, as the index stores it."""
    lstat = os.lstat
    try:
        size = lstat(d + "/events.jsonl").st_size
    except OSError:
        size = None
    try:
        st = lstat(d + "/index/about.json")
        about = [st.st_ino, st.st_size, st.st_mtime_ns]
    except OSError:
        about = None
    return [size, about]


def _same_prices(described, opts: dict) -> bool:
    """Whether the index was priced by the shipped table with the config's ``[prices]``."""
    from memfs.store.paths import config_path
    from memfs.usage import prices

    path = config_path(opts.get("config"))
    wanted = _config_file(path).get("prices", {}) if path is not None else {}
    table = prices.table()
    overrides = described.get("overrides") if type(described) is dict else None
    if type(described) is not dict or (described.get("name"), described.get("date")) != (table.name, table.date):
        return False
    try:
        return overrides == {m: {k: float(v) for k, v in r.items()} for m, r in sorted(wanted.items())}
    except (TypeError, ValueError, AttributeError):
        return False


def register(c) -> None:
    c.add("statusline", lambda args: 2, "one line for Claude Code's statusLine: model, this session's cost, today's, "
          "the active billing block's and its time left, context tokens (reads the statusLine JSON on stdin)")
