"""The price table (SPEC §12): what memfs ships (``prices.toml`` beside this module) and what the
config overrides per model (``[prices."<model>"]``, :func:`configure`).

:func:`cost` prices one turn's tokens (memfs's normal form, :data:`TOKEN_KEYS`: ``input`` is
the uncached input) and returns ``(usd, None)`` or ``(None, reason)`` — never a guess:

* a model the table does not know, a turn with no model, a rate the table lacks for a kind of
  token the turn has, or a turn whose input passes the model's long-context tier boundary
  (``tier_above``: the turn sums several requests whose sizes are unknown) → no cost, a reason;
* a turn without tokens costs 0 whatever its model.

A model is found by its exact name, then without a provider prefix (``openai/``,
``models/``, ``anthropic.``) and a date or ``-latest`` suffix (``claude-sonnet-4-5-20250929``
→ ``claude-sonnet-4-5``). Never by a family guess. An override found so (``[prices.
"claude-opus-4-1-20250805"]`` with only ``input``) keeps the rest of that entry's rates. A rate
must price 2^53 tokens (:mod:`memfs.counts`) to a finite cost (:func:`rate_problem`; the config
refuses others at load).
"""

from __future__ import annotations

import math
import re
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

from memfs.counts import MAX_COUNT, show

TOKEN_KEYS = ("input", "cached_input", "cache_creation", "output", "reasoning")
RATE_KEYS = ("input", "cached_input", "cache_write", "output")
TABLE_FILE = Path(__file__).with_name("prices.toml")
_SUFFIX = re.compile(r"(?:[-@](?:20\d{6}|20\d\d-\d\d-\d\d|latest|v\d+(?::\d+)?))+$")
_PREFIX = re.compile(r"^(?:[a-z0-9_.-]+/|anthropic\.|us\.anthropic\.|eu\.anthropic\.)")


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens; None: the table has no such rate."""

    input: float | None
    cached_input: float | None
    cache_write: float | None
    output: float | None
    tier_above: int | None = None
    overridden: bool = False


class Table:
    """The shipped table with the config's overrides laid over it."""

    def __init__(self, path: Path = TABLE_FILE):
        with open(path, "rb") as f:
            data = tomllib.load(f)
        head = data.get("table", {})
        self.name: str = head.get("name", path.name)
        self.date: str = head.get("date", "")
        self.base = {model: _price(rates) for model, rates in data.get("models", {}).items()}
        self.models = dict(self.base)
        self.overrides: dict[str, dict] = {}

    def configure(self, overrides: dict[str, dict]) -> None:
        """Lay ``{model: {rate: usd}}`` over the shipped table (rates missing from an override
        keep the shipped model's, if any)."""
        models = dict(self.base)
        for model, rates in overrides.items():
            shipped = _find(self.base, model)  # a dated name inherits its undated entry's rates
            merged = {k: getattr(shipped, k) for k in RATE_KEYS} if shipped is not None else {}
            merged.update({k: float(v) for k, v in rates.items() if k in RATE_KEYS})
            tier = shipped.tier_above if shipped is not None else None
            models[model] = Price(merged.get("input"), merged.get("cached_input"), merged.get("cache_write"),
                                  merged.get("output"), tier, True)
        self.models, self.overrides = models, {m: dict(r) for m, r in overrides.items()}

    def lookup(self, model: str | None) -> Price | None:
        return _find(self.models, model) if model else None

    def describe(self) -> dict:
        """What a usage report says about the prices it used."""
        return {"name": self.name, "date": self.date, "overrides": {m: self.overrides[m] for m in sorted(self.overrides)}}


def _find(models: dict[str, Price], model: str) -> Price | None:
    """``model``'s entry: by its exact name, else without provider prefix and date suffix."""
    found = models.get(model)
    if found is None:
        found = models.get(_SUFFIX.sub("", _PREFIX.sub("", model.lower())))
    return found


def rate_problem(usd: object) -> str | None:
    """None when ``usd`` (USD per million tokens) can price any count (up to 2^53 tokens, see
    :mod:`memfs.counts`) to a finite cost, else why not."""
    if type(usd) not in (int, float):
        return "must be a number of USD per million tokens"
    try:
        rate = float(usd)  # type: ignore[arg-type]
    except OverflowError:
        rate = math.inf
    if not rate >= 0:
        return "must be a non-negative number of USD per million tokens"
    if not math.isfinite(rate * MAX_COUNT / 1_000_000 * len(RATE_KEYS)):
        return f"{show(usd)} is too large: 2^53 tokens at that rate cost more than a float holds"
    return None


def _price(rates: dict) -> Price:
    def rate(key: str) -> float | None:
        v = rates.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    tier = rates.get("tier_above")
    return Price(rate("input"), rate("cached_input"), rate("cache_write"), rate("output"),
                 tier if type(tier) is int else None)


_table: Table | None = None
_lock = threading.Lock()


def table() -> Table:
    """The process's price table (read once)."""
    global _table
    with _lock:
        if _table is None:
            _table = Table()
        return _table


def configure(overrides: dict[str, dict] | None) -> None:
    """Apply the config's ``[prices."<model>"]`` tables (validated by :mod:`memfs.config`)."""
    if overrides:
        table().configure(overrides)


def cost(tokens: dict, model: str | None) -> tuple[float | None, str | None]:
    """``(usd, None)`` or ``(None, reason)`` for one turn's ``tokens`` (:data:`TOKEN_KEYS`)."""
    kinds = (("input", "input"), ("cached_input", "cached_input"), ("cache_creation", "cache_write"),
             ("output", "output"))
    if not any(tokens.get(k, 0) for k, _ in kinds):
        return 0.0, None
    if not model:
        return None, "no model recorded for this turn"
    price = table().lookup(model)
    if price is None:
        return None, f"no price for model {model!r} in {table().name} {table().date} (add [prices.\"{model}\"] to the config)"
    prompt = tokens.get("input", 0) + tokens.get("cached_input", 0) + tokens.get("cache_creation", 0)
    if price.tier_above is not None and prompt > price.tier_above:
        return None, (f"{prompt} input tokens pass {model}'s long-context tier ({price.tier_above}): "
                      "the per-request sizes are unknown")
    usd = 0.0
    for key, rate_key in kinds:
        n = tokens.get(key, 0)
        if not n:
            continue
        rate = getattr(price, rate_key)
        if rate is None:
            return None, f"no {rate_key} price for model {model!r}"
        usd += n * rate / 1_000_000
    return round(usd, 10), None
