"""The configuration file (SPEC §8): ``mount.example.toml`` documents every key.

:class:`Config` holds every setting; :func:`load_config` reads a TOML file into one and
:func:`apply_overrides` lays command-line flags over it (flags win). The file's layout:

* top level: ``store``, ``workspace``, ``mountpoint``, ``session``, ``read_only``,
  ``allow_other``, ``uid``, ``gid``, ``durability``, ``max_events``, ``evict_to``, ``max_line_bytes``,
  ``max_rejected_bytes``, ``log_level``, ``daemon``;
* ``[retention]``: ``max_sessions``, ``max_age_days``;
* ``[search]``: ``max_results``, ``min_score``, and the defaults of SPEC §5.1's options
  (``stem``, ``stopwords``, ``in``, ``agent``, ``project``, ``status``, ``since``, ``until``,
  ``session``, ``distinct``, ``format``), checked by :func:`memfs.search.options.parse_options`
  (a relative ``since``/``until`` such as ``"7d"`` is measured from each search's time);
* ``[cluster]``: ``servers`` (a list of ``nats://`` URLs, or one comma-separated string),
  ``stream``, ``replicas``, ``timeout``, ``max_age``, ``max_bytes``, ``backlog`` (SPEC §9),
  and authentication: ``user``, ``password_file``, ``token_file``, ``creds``, ``tls_ca``,
  ``tls_cert``, ``tls_key`` (files, never secrets inline: :mod:`memfs.cluster.auth`);
* ``[prices."<model>"]``: ``input``, ``cached_input``, ``cache_write``, ``output`` in USD per
  million tokens (SPEC §12), laid over the price table memfs ships (:mod:`memfs.usage.prices`).

Decisions recorded here:

* An unknown key or a value of the wrong type is an error naming the key (a typo must not be
  silently ignored); so is a file that sets both ``store`` and ``workspace``.
* Relative paths in a file are relative to the file's own directory, and ``~`` is expanded,
  so a config works whatever the current directory is. Paths given as flags are taken as
  the shell gave them.
* A ``--store`` flag replaces a ``workspace`` from the file and vice versa: the flag says
  which store is meant.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfs.cluster import AUTH_KEYS, AUTH_PATH_KEYS, ClusterConfig, parse_servers
from memfs.errors import MemfsError
from memfs.store.config import (
    DEFAULT_EVICT_TO,
    DEFAULT_IDLE_RELEASE,
    DEFAULT_MAX_EVENTS,
    DEFAULT_MAX_LINE_BYTES,
    DURABILITY_MODES,
    check_evict_to,
)
from memfs.store.paths import default_root, workspace_root
from memfs.store.rejected import DEFAULT_MAX_REJECTED_BYTES
from memfs.usage.prices import rate_problem

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class ConfigError(MemfsError):
    """The configuration file or a setting is invalid."""

    errno_name = "EINVAL"


@dataclass(slots=True)
class RetentionConfig:
    """``[retention]``: the ``memfs gc`` policy (SPEC §7)."""

    max_sessions: int = 50
    max_age_days: float = 30


@dataclass(slots=True)
class SearchConfig:
    """``[search]``: defaults of ``memfs search`` and the mount's ``search/`` files (SPEC §5)."""

    max_results: int = 6
    min_score: float = 0.0
    # SPEC §5.1 options, as text (``parse_options`` checks them); ``in`` is ``corpus`` here
    stem: str = "none"
    stopwords: str = "none"
    corpus: str = "facts"
    agent: str | None = None
    project: str | None = None
    status: str | None = None
    since: str | None = None
    until: str | None = None
    session: str | None = None
    distinct: str = "none"
    format: str = "jsonl"

    def params(self) -> dict[str, str]:
        """The table as search parameters (``{name: text}``, SPEC §5.1 names)."""
        out = {"k": str(self.max_results), "min_score": repr(float(self.min_score))}
        for name in ("stem", "stopwords", "corpus", "agent", "project", "status", "since", "until", "session",
                     "distinct", "format"):
            value = getattr(self, name)
            if value is not None:
                out["in" if name == "corpus" else name] = value
        return out


@dataclass(slots=True)
class Config:
    """Every memfs setting, with the filesystem's defaults."""

    store: str | None = None  # the sessions root; None: workspace, else the default (§1)
    workspace: str | None = None  # a VT Code workspace: its .vtcode/sessions is the store
    mountpoint: str | None = None
    session: str | None = None  # mount only this session
    read_only: bool = False
    allow_other: bool = False
    uid: int | None = None  # owner reported for every node; None: the mounting user
    gid: int | None = None
    durability: str = "write"
    max_events: int = DEFAULT_MAX_EVENTS
    evict_to: float = DEFAULT_EVICT_TO  # an eviction goes down to evict_to × max_events (§3.7)
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    max_rejected_bytes: int = DEFAULT_MAX_REJECTED_BYTES  # rejected.jsonl rotates past this (SPEC §3.8)
    idle_release: float = DEFAULT_IDLE_RELEASE  # a writer keeps the lock this long after its last change (§3.5)
    max_open_sessions: int = 256  # sessions a mount keeps open, one descriptor each (§3.5)
    log_level: str = "INFO"
    daemon: bool = False
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  # [cluster]: SPEC §9; no servers, no cluster
    prices: dict[str, dict[str, float]] = field(default_factory=dict)  # [prices."<model>"]: SPEC §12

    # flat aliases of the table settings, for callers that think of them as plain options
    @property
    def max_sessions(self) -> int:
        return self.retention.max_sessions

    @property
    def max_age_days(self) -> float:
        return self.retention.max_age_days

    @property
    def max_results(self) -> int:
        return self.search.max_results

    @property
    def min_score(self) -> float:
        return self.search.min_score

    def sessions_root(self) -> Path:
        """The store this configuration names: ``store``, else ``workspace/.vtcode/sessions``,
        else the default root (``$XDG_DATA_HOME/memfs/sessions``)."""
        if self.store:
            return Path(self.store)
        if self.workspace:
            return workspace_root(self.workspace)
        return default_root()

    def validate(self) -> Config:
        """Check value ranges; raise :class:`ConfigError` naming the first bad setting."""
        if self.store and self.workspace:
            raise ConfigError("set either store or workspace, not both")
        if self.durability not in DURABILITY_MODES:
            raise ConfigError(f"durability must be one of {', '.join(DURABILITY_MODES)}, not {self.durability!r}")
        if self.log_level.upper() not in LOG_LEVELS:
            raise ConfigError(f"log_level must be one of {', '.join(LOG_LEVELS)}, not {self.log_level!r}")
        self.log_level = self.log_level.upper()
        for name in ("max_events", "uid", "gid"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name} must not be negative")
        try:
            check_evict_to(self.evict_to)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.max_line_bytes < 1:
            raise ConfigError("max_line_bytes must be at least 1")
        if self.max_rejected_bytes < 1:
            raise ConfigError("max_rejected_bytes must be at least 1")
        if self.idle_release < 0:
            raise ConfigError("idle_release must not be negative")
        if self.max_open_sessions < 1:
            raise ConfigError("max_open_sessions must be at least 1")
        if self.retention.max_sessions < 0 or self.retention.max_age_days < 0:
            raise ConfigError("retention.max_sessions and retention.max_age_days must not be negative")
        if self.search.max_results < 1:
            raise ConfigError("search.max_results must be at least 1")
        if self.search != SearchConfig(max_results=self.search.max_results, min_score=self.search.min_score):
            from memfs.errors import BadQuery  # (the search package loads only when options are set)
            from memfs.search.options import parse_options

            try:
                parse_options(self.search.params())
            except BadQuery as exc:
                raise ConfigError(f"[search]: {exc}") from None
        if isinstance(self.cluster.servers, str):  # "nats://a:4222,nats://b:4222"
            self.cluster.servers = parse_servers(self.cluster.servers)
        self.cluster.validate()
        return self


# key -> (accepted Python types, description for the error message)
_STR = ((str,), "a string")
_BOOL = ((bool,), "true or false")
_INT = ((int,), "an integer")
_NUM = ((int, float), "a number")
_TOP: dict[str, tuple] = {
    "store": _STR, "workspace": _STR, "mountpoint": _STR, "session": _STR,
    "read_only": _BOOL, "allow_other": _BOOL, "uid": _INT, "gid": _INT,
    "durability": _STR, "max_events": _INT, "evict_to": _NUM, "max_line_bytes": _INT, "max_rejected_bytes": _INT,
    "log_level": _STR,
    "idle_release": _NUM, "max_open_sessions": _INT,
    "daemon": _BOOL,
}
_TABLES: dict[str, dict[str, tuple]] = {
    "retention": {"max_sessions": _INT, "max_age_days": _NUM},
    "search": {"max_results": _INT, "min_score": _NUM, "stem": _STR, "stopwords": _STR, "in": _STR,
               "agent": _STR, "project": _STR, "status": _STR, "since": _STR, "until": _STR, "session": _STR,
               "distinct": _STR, "format": _STR},
    "cluster": {"servers": ((list, str), "a list of nats:// URLs"), "stream": _STR, "replicas": _INT,
                "timeout": _NUM, "max_age": _NUM, "max_bytes": _INT, "backlog": _INT,
                **{key: _STR for key in AUTH_KEYS}},
}
_PATH_KEYS = ("store", "workspace", "mountpoint")


def _checked(where: str, key: str, value: Any, spec: tuple) -> Any:
    types, what = spec
    if type(value) is bool and bool not in types:  # TOML booleans are not numbers
        raise ConfigError(f"{where}: {key} must be {what}, not {value!r}")
    if not isinstance(value, types):
        raise ConfigError(f"{where}: {key} must be {what}, not {value!r}")
    return value


PRICE_KEYS = ("input", "cached_input", "cache_write", "output")


def _prices(where: str, value: Any) -> dict[str, dict[str, float]]:
    """``[prices."<model>"]`` tables: each a table of known rates, non-negative numbers."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: [prices] must hold one table per model ([prices.\"<model>\"])")
    out: dict[str, dict[str, float]] = {}
    for model, rates in value.items():
        if not isinstance(rates, dict) or not rates:
            raise ConfigError(f"{where}: prices.{model!r} must be a table of {', '.join(PRICE_KEYS)}")
        for rate, usd in rates.items():
            if rate not in PRICE_KEYS:
                raise ConfigError(f"{where}: unknown key prices.{model!r}.{rate} (known: {', '.join(PRICE_KEYS)})")
            usd = _checked(where, f"prices.{model!r}.{rate}", usd, _NUM)
            problem = rate_problem(usd)
            if problem is not None:
                raise ConfigError(f"{where}: prices.{model!r}.{rate} {problem}")
        out[model] = {rate: float(usd) for rate, usd in rates.items()}
    return out


def load_config(path: str | os.PathLike) -> Config:
    """Read a TOML configuration file into a validated :class:`Config`.

    Unknown keys, wrong types and out-of-range values raise :class:`ConfigError`; a missing
    or unreadable file raises ``OSError``.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    config = Config()
    for key, value in data.items():
        if key == "prices":
            config.prices = _prices(str(path), value)
            continue
        if key in _TABLES:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: [{key}] must be a table")
            table = getattr(config, key)
            for sub, subvalue in value.items():
                spec = _TABLES[key].get(sub)
                if spec is None:
                    raise ConfigError(f"{path}: unknown key {key}.{sub} "
                                      f"(known: {', '.join(_TABLES[key])})")
                subvalue = _checked(str(path), f"{key}.{sub}", subvalue, spec)
                if key == "cluster" and sub in AUTH_PATH_KEYS:
                    subvalue = os.path.abspath(path.parent / Path(subvalue).expanduser())
                setattr(table, "corpus" if (key, sub) == ("search", "in") else sub, subvalue)
            continue
        spec = _TOP.get(key)
        if spec is None:
            raise ConfigError(f"{path}: unknown key {key!r} (known: {', '.join([*_TOP, *_TABLES])})")
        value = _checked(str(path), key, value, spec)
        if key in _PATH_KEYS:
            value = str(path.parent / Path(value).expanduser())
        setattr(config, key, value)
    try:
        return config.validate()
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


# (a table key that is also a top-level one, e.g. search.session, is set dotted only)
_FLAT_TABLE_KEYS = {sub: table for table, subs in _TABLES.items() for sub in subs if sub not in _TOP}


def apply_overrides(config: Config, overrides: dict[str, Any]) -> Config:
    """A copy of ``config`` with every non-None value of ``overrides`` applied (flags win).

    Keys are setting names; the table settings may be given flat (``max_sessions``) or
    dotted (``retention.max_sessions``). Setting ``store`` clears ``workspace`` and vice versa.
    """
    new = dataclasses.replace(config, retention=dataclasses.replace(config.retention), prices=dict(config.prices),
                              search=dataclasses.replace(config.search),
                              cluster=dataclasses.replace(config.cluster, servers=list(config.cluster.servers)))
    for key, value in overrides.items():
        if value is None:
            continue
        table, _, sub = key.rpartition(".")
        if not table:
            table = _FLAT_TABLE_KEYS.get(key, "")
        if table:
            if sub not in _TABLES.get(table, {}):
                raise ConfigError(f"unknown setting {key!r}")
            setattr(getattr(new, table), "corpus" if (table, sub) == ("search", "in") else sub, value)
            continue
        if key not in _TOP:
            raise ConfigError(f"unknown setting {key!r}")
        if key == "store":
            new.workspace = None
        elif key == "workspace":
            new.store = None
        setattr(new, key, value)
    return new.validate()
