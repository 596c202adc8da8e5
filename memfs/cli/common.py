"""What every command of the command line shares: output, the store it works on, argument
types, usage errors, and how a command registers its parser."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from memfs.config import Config, apply_overrides, load_config
from memfs.errors import MemfsError
from memfs.store.config import check_evict_to
from memfs.store.paths import config_path
from memfs.store.rejected import set_max_rejected_bytes
from memfs.text import one_line, visible, visible_bytes

# --- output ------------------------------------------------------------------------------


class ProgressBar:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal.

    Call it as ``bar(done, total)`` (the library's progress callback); use as a context
    manager so the line is cleared at the end.
    """

    WIDTH = 30

    def __init__(self, label: str, stream=None):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.enabled = self.stream.isatty()
        except (AttributeError, ValueError):
            self.enabled = False
        self._last = 0.0
        self._drawn = 0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        filled = self.WIDTH * done // total
        text = f"\r{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{total}"
        self.stream.write(text)
        self.stream.flush()
        self._drawn = len(text)

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc) -> None:
        if self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()


def _out(text: str = "") -> None:
    """A line on stdout, its control characters made visible (:func:`memfs.text.visible`): what
    the command line prints can carry text from the agents' files."""
    sys.stdout.write(visible(text) + "\n")


def _err(text: str) -> None:
    """A message on stderr (``memfs: <reason>``), its control characters made visible."""
    print(visible(text), file=sys.stderr, flush=True)


def _out_bytes(data: bytes) -> None:
    """A document (a view, an export) on stdout, its control characters made visible. JSON
    stays the same JSON: orjson escapes C0 but writes DEL, C1 and the bidi controls raw, and
    their ``\\uXXXX`` stands only inside strings, where it means exactly them."""
    data = visible_bytes(data)
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # (a stdout made of text: a caller capturing it)
        sys.stdout.write(data.decode("utf-8", "surrogateescape"))
        return
    sys.stdout.flush()
    buffer.write(data)
    buffer.flush()


def _json(value: Any) -> None:
    _out_bytes(orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _lines(n: int) -> str:
    return f"{n} line{'s' if n != 1 else ''}"


def _table(rows: list[list[str]], right: set[int] | frozenset[int] = frozenset()) -> None:
    rows = [[one_line(c) for c in row] for row in rows]  # a cell is one line, nothing in it a control
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        _out("  ".join(cells).rstrip())


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        return f"{exc.strerror}: {exc.filename}"
    return str(exc) or type(exc).__name__


# --- configuration -----------------------------------------------------------------------


def _config(args: argparse.Namespace, **overrides: Any) -> Config:
    """The config file (if any) with the command's flags laid over it."""
    path = config_path(getattr(args, "config", None))  # --config, else $XDG_CONFIG_HOME/memfs/config.toml
    base = load_config(path) if path is not None else Config()
    flags = {"store": getattr(args, "store", None), "workspace": getattr(args, "workspace", None)}
    flags.update(overrides)
    config = apply_overrides(base, flags)
    set_max_rejected_bytes(config.max_rejected_bytes)  # process-wide: see memfs.store.rejected
    if config.prices:  # [prices."<model>"] over the shipped table, process-wide (SPEC §12)
        from memfs.usage import prices

        prices.configure(config.prices)
    return config


def _root(args: argparse.Namespace) -> Path:
    """The store a command works on; it must exist (a mistyped --store is not an empty one)."""
    return _existing(_config(args).sessions_root())


class _NewStore:
    """A writing command on a store that does not exist creates it: called once the work
    began, it says so (once) when the store has come to exist (a mistyped --store shows)."""

    def __init__(self, command: str, root: Path, dry_run: bool = False):
        self.command, self.root = command, root
        self.pending = not os.path.lexists(root)
        if self.pending and dry_run:
            _err(f"memfs: {command}: the store {root} does not exist: a run without --dry-run creates it")
            self.pending = False

    def __call__(self, *_: Any) -> None:
        if self.pending and os.path.isdir(self.root):
            self.pending = False
            _err(f"memfs: {self.command}: the store {self.root} did not exist: created it")


def _existing(root: Path) -> Path:
    if not os.path.lexists(root):
        raise MemfsError(f"no store at {root}: it does not exist (check --store/--workspace)")
    if not os.path.isdir(root):
        raise MemfsError(f"{root} is not a store: not a directory")
    return root


# --- the parser --------------------------------------------------------------------------


class _Usage(Exception):
    """A usage error found after parsing (exit 2)."""


def _nonneg_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def _pos_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _evict_to(text: str) -> float:
    try:
        value = float(text)
        check_evict_to(value)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a number from 0.5 to 1.0") from None
    return value


EVICT_TO_HELP = ("once over the cap, evict whole completed turns down to FRACTION x max-events "
                 "(0.5-1.0, default 0.9; 1.0: just under the cap, a rewrite at almost every turn)")


def _nonneg_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


@dataclass
class Commands:
    """Where a command group adds its commands: ``add`` makes one subcommand's parser, with
    the options every command takes (``common``) and, when asked, ``--json`` (``as_json``)."""

    sub: Any  # the parser's subparsers action
    common: argparse.ArgumentParser
    as_json: argparse.ArgumentParser

    def add(self, name: str, func: Callable[[argparse.Namespace], int], help: str | None = None, *,
            json: bool = False, parents: tuple[argparse.ArgumentParser, ...] | None = None,
            **kw: Any) -> argparse.ArgumentParser:
        if help is None:  # the one-line help lives in the command table
            from memfs.cli import COMMANDS

            help = COMMANDS[name][2]
        if parents is None:
            parents = (self.common, self.as_json) if json else (self.common,)
        p = self.sub.add_parser(name, parents=list(parents), help=help, description=help, **kw)
        p.set_defaults(func=func)
        return p
