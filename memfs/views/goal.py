"""``derived/goal.json`` (SPEC §4.3): the GoalTracker, a state machine driven by ``goal.*`` events.

Transitions:

====================== ===================================== ==================================
event                  applies when                          new status
====================== ===================================== ==================================
``goal.created``       always (replaces any previous goal)   ``active``
``goal.paused``        status is ``active``                  by ``reason``: user →
                                                             ``user_paused``, back_off →
                                                             ``back_off_paused``, no_progress →
                                                             ``no_progress_paused``, infra →
                                                             ``infra_paused``, verification →
                                                             ``blocked``
``goal.resumed``       status is a paused one (the five      ``active``
                       above)
``goal.completed``     active or paused                      ``complete``
``goal.budget_exceeded`` active or paused                    ``budget_limited``
``goal.cleared``       a goal exists                         no goal (every field null)
====================== ===================================== ==================================

Every ``goal.*`` event is noted in ``history`` as ``{event, detail, offset}``; one that does not
apply is ignored and its detail says why (``"ignored: …"``).

Decisions recorded here where the spec is silent:

* ``goal.created`` needs string ``goal_id`` and ``objective``; a ``token_budget`` that is not a
  non-negative integer reads null. Without them the event is ignored.
* An event naming a ``goal_id`` other than the current goal's is ignored; one naming none
  applies to the current goal. An unknown ``reason`` or ``goal.*`` type is ignored.
* ``budget_limited`` is not a paused status: ``goal.resumed`` does not leave it (a new
  ``goal.created`` does). ``complete`` is final for every transition but ``created``/``cleared``.
* ``tokens_used`` sums ``input_tokens + output_tokens`` of the usage carried by
  ``turn.completed`` / ``turn.failed`` / ``turn.blocked`` events after the goal's creation.
  Exceeding ``token_budget`` does not change the status by itself: only ``goal.budget_exceeded``
  does (the tracker follows the log, it does not decide).
* ``created_at`` is the event's own ``created_at`` string, else the time of its turn (see
  ``memfs.views.progress``), else the session's ``created_at``.
* ``history`` spans the whole retained log (goals before a replacement included); events in
  evicted turns are gone with them, so after an eviction the tracker reflects the retained log.
"""

from __future__ import annotations

ACTIVE = "active"
PAUSE_STATUS = {
    "user": "user_paused",
    "back_off": "back_off_paused",
    "no_progress": "no_progress_paused",
    "infra": "infra_paused",
    "verification": "blocked",
}
PAUSED = frozenset(PAUSE_STATUS.values())
BUDGET_LIMITED = "budget_limited"
COMPLETE = "complete"


class GoalTracker:
    """Goal state folded from ``goal.*`` events."""

    __slots__ = ("goal_id", "objective", "status", "token_budget", "tokens_used", "created", "history")

    def __init__(self) -> None:
        self.goal_id: str | None = None
        self.objective: str | None = None
        self.status: str | None = None
        self.token_budget: int | None = None
        self.tokens_used = 0
        self.created: str | int | None = None  # a progress.Stamp
        self.history: list[dict] = []

    def _note(self, etype: str, detail: str, offset: int) -> None:
        self.history.append({"event": etype, "detail": detail, "offset": offset})

    def add_tokens(self, n: int) -> None:
        if self.status is not None:
            self.tokens_used += n

    def apply(self, event: dict, offset: int, stamp) -> None:
        """Fold one ``goal.*`` event found at byte ``offset``; ``stamp`` dates a creation."""
        etype = event["type"]
        if etype == "goal.created":
            goal_id, objective = event.get("goal_id"), event.get("objective")
            if type(goal_id) is not str or type(objective) is not str:
                self._note(etype, "ignored: goal_id and objective must be strings", offset)
                return
            budget = event.get("token_budget")
            replaced = f" (replaces {self.goal_id})" if self.status is not None else ""
            self.goal_id, self.objective, self.status = goal_id, objective, ACTIVE
            self.token_budget = budget if type(budget) is int and budget >= 0 else None
            self.tokens_used = 0
            created_at = event.get("created_at")
            self.created = created_at if type(created_at) is str else stamp
            self._note(etype, f"active: {objective}{replaced}", offset)
            return
        if self.status is None:
            self._note(etype, "ignored: no goal", offset)
            return
        named = event.get("goal_id")
        if named is not None and named != self.goal_id:
            self._note(etype, f"ignored: goal {named!r} is not the current goal", offset)
            return
        before = self.status
        if etype == "goal.paused":
            reason = event.get("reason")
            target = PAUSE_STATUS.get(reason) if type(reason) is str else None
            if target is None:
                self._note(etype, f"ignored: unknown pause reason {reason!r}", offset)
                return
            if before != ACTIVE:
                self._note(etype, f"ignored: cannot pause from {before}", offset)
                return
            self.status = target
        elif etype == "goal.resumed":
            if before not in PAUSED:
                self._note(etype, f"ignored: cannot resume from {before}", offset)
                return
            self.status = ACTIVE
        elif etype in ("goal.completed", "goal.budget_exceeded"):
            if before != ACTIVE and before not in PAUSED:
                self._note(etype, f"ignored: cannot leave {before}", offset)
                return
            self.status = COMPLETE if etype == "goal.completed" else BUDGET_LIMITED
        elif etype == "goal.cleared":
            self.goal_id = self.objective = self.status = self.token_budget = self.created = None
            self.tokens_used = 0
            self._note(etype, f"{before} → cleared", offset)
            return
        else:
            self._note(etype, "ignored: unknown goal event", offset)
            return
        self._note(etype, f"{before} → {self.status}", offset)

    def to_dict(self, resolve) -> dict:
        """The ``goal.json`` object; ``resolve(stamp) -> str`` dates the creation."""
        return {
            "goal_id": self.goal_id,
            "objective": self.objective,
            "status": self.status,
            "token_budget": self.token_budget,
            "tokens_used": self.tokens_used,
            "created_at": resolve(self.created) if self.status is not None else None,
            "history": self.history,
        }
