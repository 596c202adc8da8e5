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
building the parser) and reading the store's usage summary (:mod:`memfs.usage.recent`: each
session's cost and the turns of today and of the blocks that may be active), current while the
store catalog's cursor and the root's mtime are what it recorded — the same few reads at any
store size; only when it is not (or missing) are the usage modules loaded to redo the stale
entries (:func:`memfs.usage.reporting.contributions`), which also rewrites the usage index and
the summary for the next redraw. A missing or unreadable store still prints
the line from stdin alone. Options: ``--store DIR``/``--workspace DIR``/``--config FILE`` as
every command (the config file is read for ``store``/``workspace`` and ``[prices]`` only).
"""

from __future__ import annotations

import json
import os
import sys
import time

TAIL = 256 * 1024  # bytes of the transcript read back for the last usage


def run(argv: list[str]) -> int:
    opts = _options(argv)
    if opts is None:
        return 2
    try:
        data = json.loads(sys.stdin.buffer.read() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
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
    sid = data.get("session_id")
    mine, recent = _summary(opts, sid if type(sid) is str else None)
    now = time.time()
    if mine and mine[1]:
        parts.append("session " + _cost(*mine))
    else:
        own = _get(data, "cost", "total_cost_usd")
        parts.append(f"session {_usd(own)} (claude)" if type(own) in (int, float) else "session -")
    today = time.strftime("%Y-%m-%d", time.localtime(now))
    parts.append("today " + _costs([u for u in recent if time.strftime("%Y-%m-%d", time.localtime(u[0])) == today]))
    parts.append(_block(recent, now))
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


def _cost(priced: float, uses: int, n_priced: int) -> str:
    """A cost of ``uses`` turns, ``n_priced`` of them priced (``*``: the priced part)."""
    if uses and not n_priced:
        return "-"
    return _usd(priced) + ("*" if n_priced < uses else "")


def _costs(uses: list) -> str:
    """The cost of ``[at, cost]`` turns."""
    priced = [u[1] for u in uses if u[1] is not None]
    return _cost(sum(priced), len(uses), len(priced))


def _block(uses: list, now: float) -> str:
    from memfs.usage.windows import BLOCK, active, split

    times = [u[0] for u in uses]
    for start, first, stop, gap in reversed(split(times)):
        if not gap:
            if active(start, times[stop - 1], now):
                left = int(start + BLOCK - now) // 60
                return f"block {_costs(uses[first:stop])}, {left // 60}h{left % 60:02d}m left"
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
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
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


def _summary(opts: dict, session: str | None) -> tuple[list | None, list]:
    """``(session's [priced cost, turns, priced turns] or None, the recent [at, cost] turns)``
    from the store's usage summary (:mod:`memfs.usage.recent`) when it is current, else from
    the usage index made current (which rewrites both); nothing when there is no store."""
    try:
        from memfs.usage import recent

        root = _root(opts)
        fast = recent.read(root, session)
        if fast is not None and _current_key(json.loads(fast[0]), opts):
            return fast[1], fast[2]
        from memfs.usage.reporting import contributions

        _configure(opts)
        sessions, every = recent.build({name: c.uses for name, c in contributions(root).items()})
        return sessions.get(session) if session is not None else None, every
    except Exception:  # noqa: BLE001 — a status line never fails: it shows what it has
        return None, []


def _configure(opts: dict) -> None:
    from memfs.config import load_config
    from memfs.store.paths import config_path
    from memfs.usage import prices

    path = config_path(opts.get("config"))
    if path is not None:
        prices.configure(load_config(path).prices)


def _current_key(key, opts: dict) -> bool:
    """Whether a usage index ``key`` is this version's, priced as the config says."""
    from memfs.usage import INDEX_FORMAT, VIEW_VERSION

    return type(key) is list and len(key) == 3 and key[:2] == [VIEW_VERSION, INDEX_FORMAT] and \
        _same_prices(key[2], opts)


def _same_prices(described, opts: dict) -> bool:
    """Whether the index was priced with the config's ``[prices]`` (the shipped table's identity
    is the summary's to check: :func:`memfs.usage.recent.read`)."""
    from memfs.store.paths import config_path

    path = config_path(opts.get("config"))
    wanted = _config_file(path).get("prices", {}) if path is not None else {}
    overrides = described.get("overrides") if type(described) is dict else None
    try:
        return overrides == {m: {k: float(v) for k, v in r.items()} for m, r in sorted(wanted.items())}
    except (TypeError, ValueError, AttributeError):
        return False


def register(c) -> None:
    c.add("statusline", lambda args: 2)
