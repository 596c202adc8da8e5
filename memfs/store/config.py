"""How one session is opened: its durability, cap and limits (SPEC §3.2, §3.7) — decided here.

:class:`SessionConfig` is frozen: a second open of a session in the same process that asks
for a stronger durability replaces the config whole (:meth:`SessionConfig.strongest`), it
never edits it. Everything that depends on the durability mode asks the config
(:attr:`~SessionConfig.writes_through`, :attr:`~SessionConfig.syncs`) rather than comparing
mode names, so the fsync strategy is changed in one place.

The line-size limit is checked once, by :func:`check_line_size`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from memfs.errors import LineTooLong

DURABILITY_MODES = ("buffered", "write", "fsync")  # weakest first
DEFAULT_MAX_EVENTS = 10_000
DEFAULT_EVICT_TO = 0.9  # an eviction goes down to this fraction of max_events (SPEC §3.7)
EVICT_TO_RANGE = (0.5, 1.0)
DEFAULT_MAX_LINE_BYTES = 16 * 1024 * 1024
DEFAULT_METADATA_INTERVAL = 0.05
DEFAULT_IDLE_RELEASE = 5.0  # seconds a writer keeps the liveness lock after its last change (SPEC §3.5)
BUFFER_LIMIT = 64 * 1024  # buffered mode writes its pending bytes at this size (SPEC §3.2)

SummaryHook = Callable[[Path, str, list], None]


def check_evict_to(value: float) -> None:
    """Raise ``ValueError`` unless ``value`` is in :data:`EVICT_TO_RANGE` (0.5–1.0)."""
    low, high = EVICT_TO_RANGE
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"evict_to must be a number from {low} to {high}, not {value!r}")


def evict_floor(max_events: int, evict_to: float) -> int:
    """The low-water mark of an eviction: ``floor(evict_to × max_events)``, taken on the
    decimal the user wrote (``0.57 × 100`` is 57, not the 56 binary floating point gives)."""
    from decimal import ROUND_FLOOR, Decimal  # (here: loaded only by a store that evicts)

    return int((Decimal(repr(float(evict_to))) * max_events).to_integral_value(ROUND_FLOOR))


def check_line_size(size: int, limit: int, what: str = "max_line_bytes") -> None:
    """Raise :class:`LineTooLong` when a line of ``size`` bytes is over ``limit`` (``what``: where
    the limit comes from, for the reason)."""
    if size > limit:
        raise LineTooLong(f"line is {size} bytes or more, over the limit of {limit} ({what})")


def line_too_long(size: int, limit: int, what: str = "max_line_bytes") -> LineTooLong:
    """The refusal of a whole line of ``size`` bytes, over ``limit``, that was streamed past
    rather than held (:class:`memfs.store.lines.LineSplitter`)."""
    return LineTooLong(f"line is {size} bytes, over the limit of {limit} ({what})")


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """The settings one open session runs with.

    * ``durability`` — ``buffered``: lines wait in memory until a turn boundary, 64 KiB, a
      read, ``flush`` or close; ``write``: every append reaches the file before it returns;
      ``fsync``: every append returns after ``fdatasync`` (shared by concurrent appends).
    * ``max_events`` — the cap (0: none).
    * ``evict_to`` — once over the cap, an eviction removes whole closed turns until at most
      ``evict_to × max_events`` events remain (0.5–1.0; 1.0: just under the cap, VT Code's
      behaviour). :attr:`evict_floor` is that count, rounded down.
    * ``max_line_bytes`` — the longest accepted line.
    * ``summary_hook`` — replaces the default eviction summary writer.
    * ``metadata_interval`` — persists are coalesced this long on a background thread (0:
      persist at every boundary, in the appending thread).
    * ``idle_release`` — the writer releases the liveness lock once its last change is this
      many seconds old and no handle is open for writing (SPEC §3.5).
    """

    durability: str = "buffered"
    max_events: int = DEFAULT_MAX_EVENTS
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    summary_hook: SummaryHook | None = None
    metadata_interval: float = DEFAULT_METADATA_INTERVAL
    idle_release: float = DEFAULT_IDLE_RELEASE
    evict_to: float = DEFAULT_EVICT_TO
    evict_floor: int = field(init=False)  # an eviction leaves at most this many events
    writes_through: bool = field(init=False)  # every append's bytes reach the file before it returns
    syncs: bool = field(init=False)  # every append returns only once its bytes are on disk (fdatasync)

    def __post_init__(self) -> None:
        if self.durability not in DURABILITY_MODES:
            raise ValueError(f"durability must be one of {', '.join(DURABILITY_MODES)}")
        check_evict_to(self.evict_to)
        object.__setattr__(self, "evict_floor", evict_floor(self.max_events, self.evict_to))
        # derived once (read on every append): the only place that interprets the mode names
        object.__setattr__(self, "writes_through", self.durability != "buffered")
        object.__setattr__(self, "syncs", self.durability == "fsync")

    def strongest(self, durability: str) -> SessionConfig:
        """This config, with ``durability`` when that is the stronger mode."""
        if DURABILITY_MODES.index(durability) > DURABILITY_MODES.index(self.durability):
            return replace(self, durability=durability)
        return self
