"""``derived/usage.json`` (SPEC §12): a session's tokens, tools, time and cost, per turn and in total.

Rendered from the views' fold (:class:`memfs.views.fold.Fold`: per-turn usage with Claude's
split messages counted once by the ingest and Codex's cumulative counts differenced, tool calls,
models, the agent's reported cost) and the session's ``index/about.json`` (agent, project,
model, and ``turn_notes`` usage a later capture knew for a turn that lacks it).

Tokens are in one normal form whatever the agent (``tokens``: :data:`memfs.usage.prices.TOKEN_KEYS`
plus ``total``): ``input`` is the input *not* read from or written to the cache (Claude reports
it so; Codex, Gemini and native VT Code-family logs count cached and cache-written tokens inside
``input_tokens``, and memfs subtracts them), ``cached_input`` cache reads, ``cache_creation``
cache writes, ``output`` includes ``reasoning`` (reported apart where the agent does), ``total``
= input + cached_input + cache_creation + output.

Each turn is dated by its own record: its closing event's ``completed_at``, else its
``turn.started`` timestamp; ``day`` is that instant's UTC date, ``wall_seconds`` start to end
when both are there. When memfs received a turn (``index/turn-times.jsonl``) stands in only for
a session no agent capture made (``index/about.json`` names no ``conversation_id``): a capture
may be an import, whose arrival times say when the file was read, not when the turn ran. A turn
with no time at all counts on the conversation's ``started_at`` (``index/about.json``), else on
the session's creation day. A token count that is not an integer in 0..2^53 (:mod:`memfs.counts`) is
refused: the turn, its day row and the total carry ``usage_error`` (the first reason; the tokens
are then the sum of the counts accepted, incomplete) and the turn has no cost. The ``days`` list (one row per day and model) is what the store-wide
aggregates (:mod:`memfs.usage.reporting`) add up; ``total.models`` lists the models the requests ran on, in order of first use; ``source`` says what the file was computed from,
so a reader can tell a stale copy in the backing store.
"""

from __future__ import annotations

import os
import time
import weakref
from pathlib import Path

import orjson

from memfs.agents import recorded_disjoint
from memfs.agents.common import own_input
from memfs.store.about import ABOUT
from memfs.store.meta import OUTCOME_NAMES, parse_rfc3339
from memfs.usage import VIEW_VERSION, calls, prices
from memfs.usage.prices import TOKEN_KEYS

VERSION = VIEW_VERSION


def about_stamp(session_dir: Path) -> list[int] | None:
    """The identity of ``index/about.json`` now (None: absent)."""
    try:
        st = os.lstat(session_dir / ABOUT)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def normal_tokens(raw: list[int], agent: str | None) -> dict:
    """The fold's five counters (input, cached, creation, output, reasoning as recorded) in the
    normal form of the module docstring."""
    inp, cached, creation, output, reasoning = raw
    inp = own_input(recorded_disjoint(agent), inp, cached, creation)
    tokens = {"input": inp, "cached_input": cached, "cache_creation": creation, "output": output,
              "reasoning": reasoning}
    tokens["total"] = inp + cached + creation + output
    return tokens


def _parts(requests: list | None, tokens: dict, model: str | None) -> list[tuple[str | None, dict, int]] | None:
    """A turn's tokens by model, from its close's ``requests`` (SPEC §10: each request's model
    and usage): ``[(model, tokens, requests)]`` in the order the models first ran, or None when
    the turn has no requests or they do not add up to the turn's own tokens (another capture's
    usage, a note): then the turn is one part, its own model."""
    if not requests:
        return None
    by: dict = {}
    summed = dict.fromkeys(TOKEN_KEYS, 0)
    for req in requests:
        if type(req) is not dict:
            return None
        name = req.get("model") if type(req.get("model")) is str and req["model"] else model
        counts = {k: req[k] if type(req.get(k)) is int and req[k] >= 0 else 0 for k in TOKEN_KEYS}
        part = by.setdefault(name, [dict.fromkeys(TOKEN_KEYS, 0), 0])
        for key, n in counts.items():
            part[0][key] += n
            summed[key] += n
        part[1] += 1
    if any(summed[k] != tokens.get(k, 0) for k in ("input", "cached_input", "cache_creation", "output")):
        return None
    out = []
    for name, (counts, n) in by.items():
        counts["total"] = counts["input"] + counts["cached_input"] + counts["cache_creation"] + counts["output"]
        out.append((name, counts, n))
    return out


def _request_cost(requests: list, model: str | None) -> tuple[float | None, str | None]:
    """A turn's cost as billed: each request priced on its own (a long-context tier applies per
    request); unknown, with the first reason, once one request has no price."""
    total = 0.0
    for req in requests:
        name = req.get("model") if type(req.get("model")) is str and req["model"] else model
        counts = {k: req[k] if type(req.get(k)) is int and req[k] >= 0 else 0 for k in TOKEN_KEYS}
        price = prices.table().lookup(name)
        prompt = counts["input"] + counts["cached_input"] + counts["cache_creation"]
        if price is not None and price.tier_above is not None and prompt > price.tier_above:
            return None, (f"a request of {prompt} input tokens passes {name}'s long-context tier "
                          f"({price.tier_above}): {prices.table().name} has no long-context rate")
        usd, reason = prices.cost(counts, name)
        if usd is None:
            return None, reason
        total += usd
    return round(total, 10), None


def _add(into: dict, tokens: dict) -> None:
    for key in (*TOKEN_KEYS, "total"):
        into[key] = into.get(key, 0) + tokens.get(key, 0)


def _day(at: float | None) -> str | None:
    return time.strftime("%Y-%m-%d", time.gmtime(at)) if at is not None else None


def _final(about: dict, ordinal: int) -> tuple[tuple[list[int], str | None], list | None, str | None, str | None,
                                               str | None] | None:
    """A turn's ``final`` note (ingest.identity: what the agent's file says of a turn another
    capture stored): (tokens and refusal, requests, started_at, completed_at, model), or None."""
    notes = about.get("turn_notes")
    note = notes.get(str(ordinal)) if type(notes) is dict else None
    final = note.get("final") if type(note) is dict else None
    usage = _note_usage({"turn_notes": {"0": final}}, 0) if type(final) is dict else None
    if usage is None:
        return None
    requests = final.get("requests")  # (each request is read as the close's are: _parts, _request_cost)
    times = [t if type(t) is str and parse_rfc3339(t) is not None else None
             for t in (final.get("started_at"), final.get("completed_at"))]
    model = final.get("model")
    return usage, requests if type(requests) is list else None, times[0], times[1], \
        model if type(model) is str and model else None


def _note_usage(about: dict, ordinal: int) -> tuple[list[int], str | None] | None:
    notes = about.get("turn_notes")
    note = notes.get(str(ordinal)) if type(notes) is dict else None
    usage = note.get("usage") if type(note) is dict else None
    if type(usage) is not dict:
        return None
    from memfs.views.fold import _tokens

    return _tokens(usage)


class _Refused:
    """Turns whose token counts were refused (:mod:`memfs.counts`): how many, the first reason."""

    __slots__ = ("turns", "reason")

    def __init__(self) -> None:
        self.turns = 0
        self.reason: str | None = None

    def copy(self) -> _Refused:
        out = _Refused()
        out.turns, out.reason = self.turns, self.reason
        return out

    def add(self, reason: str | None) -> None:
        if reason is not None:
            self.turns += 1
            self.reason = self.reason or reason

    def fields(self, count: bool = True) -> dict:
        """``usage_error`` (only when a turn's counts were refused): its tokens are the sum of
        the counts accepted, incomplete."""
        if not self.turns:
            return {}
        return {"usage_error": f"{self.reason} ({self.turns} turns with refused token counts)" if count else self.reason}


class _Cost:
    """A sum of costs that becomes unknown (None, with the first reason) once one part is."""

    __slots__ = ("usd", "reason", "unpriced")

    def __init__(self) -> None:
        self.usd: float | None = 0.0
        self.reason: str | None = None
        self.unpriced = 0

    def copy(self) -> _Cost:
        out = _Cost()
        out.usd, out.reason, out.unpriced = self.usd, self.reason, self.unpriced
        return out

    def add(self, usd: float | None, reason: str | None) -> None:
        if usd is None:
            self.unpriced += 1
            self.reason = self.reason or reason
            self.usd = None
        elif self.usd is not None:
            self.usd += usd

    def fields(self, count: bool = True) -> dict:
        if self.usd is None:
            reason = f"{self.reason} ({self.unpriced} turns without a price)" if count else self.reason
            return {"cost_usd": None, "cost_reason": reason}
        return {"cost_usd": round(self.usd, 8)}


class _Sums:
    """What the turns add up to: totals, tools, cost, wall time, the day-and-model rows."""

    __slots__ = ("turns", "tokens", "tools", "cost", "wall", "rows", "refused", "models")

    def __init__(self) -> None:
        self.turns = 0
        self.tokens: dict[str, int] = {}
        self.tools: dict[str, list] = {}
        self.cost = _Cost()
        self.wall = 0.0
        self.rows: dict[tuple, list] = {}  # (day, model) -> [turns, tokens, _Cost, _Refused]
        self.refused = _Refused()
        self.models: list[str] = []  # the models the turns' requests ran on, in order of first use

    def add(self, turn: dict, tools: dict) -> None:
        tokens, usd, reason, refused = turn["tokens"], turn["cost_usd"], turn.get("cost_reason"), turn.get("usage_error")
        self.turns += 1
        _add(self.tokens, tokens)
        calls.merge(self.tools, tools)
        self.cost.add(usd, reason)
        self.refused.add(refused)
        self.wall += turn["wall_seconds"] or 0.0
        by_model = turn.get("by_model") or [{"model": turn["model"], "tokens": tokens, "cost_usd": usd,
                                             "cost_reason": reason}]
        for part in by_model:  # (the turn counts in its close's model's row; each model's tokens in its own)
            key = (turn["day"], part["model"])
            if part["model"] is not None and part["model"] not in self.models:
                self.models.append(part["model"])
            row = self.rows.get(key)
            if row is None:
                row = self.rows[key] = [0, {}, _Cost(), _Refused()]
            row[0] += part["model"] == turn["model"] or len(by_model) == 1
            _add(row[1], part["tokens"])
            row[2].add(part["cost_usd"], part.get("cost_reason"))
            row[3].add(refused)

    def copy(self) -> _Sums:
        out = _Sums()
        out.turns, out.tokens, out.wall = self.turns, dict(self.tokens), self.wall
        out.tools = {name: [c, f, list(ms)] for name, (c, f, ms) in self.tools.items()}
        out.cost = self.cost.copy()
        out.refused = self.refused.copy()
        out.models = list(self.models)
        out.rows = {key: [n, dict(tokens), cost.copy(), refused.copy()]
                    for key, (n, tokens, cost, refused) in self.rows.items()}
        return out


class _Turns:
    """The rendered turns of one fold but its last (which may still change: its close, the
    agent's cost reported after it), with their sums: a render adds only the turns closed since."""

    __slots__ = ("about", "used", "chunks", "sums", "__weakref__")

    def __init__(self, about: dict):
        self.about = about
        self.used: dict[int, tuple] = {}  # recorded arrival times the rendered turns took
        self.chunks: list[bytes] = []
        self.sums = _Sums()

    def valid(self, about: dict, times: dict) -> bool:
        return about is self.about and all(times.get(n) == t for n, t in self.used.items())


_TURNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Fold -> _Turns


def _turn(rec, i: int, ctx: dict) -> dict:
    raw, refused = [*rec.usage, rec.reasoning], rec.usage_error
    requests, started, completed, model = rec.requests, rec.started_at, rec.completed_at, rec.model
    final = _final(ctx["about"], rec.ordinal)  # an imported file's record of the turn (ingest.identity)
    if final is not None:
        raw, refused = final[0]
        requests = final[1] if final[1] is not None else requests
        started, completed = final[2] or started, final[3] or completed
        model = model or final[4]  # (a stored close that names none: Codex exec --json)
    elif not any(raw) and refused is None:
        raw, refused = _note_usage(ctx["about"], rec.ordinal) or (raw, None)
    tokens = normal_tokens(raw, rec.agent or ctx["agent"])  # (the turn's own agent says what its counts mean)
    # the close's (or the file's final record's) model, else its last request's
    model = model or _last_model(requests) or ctx["model"]
    parts = _parts(requests, tokens, model)
    if ctx["native"] and started is None and completed is None:
        recorded = ctx["times"].get(rec.ordinal)
        if recorded is not None:
            ctx["used"][rec.ordinal] = recorded
            started, completed = recorded
    t0 = parse_rfc3339(started) if started else None
    t1 = parse_rfc3339(completed) if completed else None
    seconds = round(t1 - t0, 3) if t0 is not None and t1 is not None and t1 >= t0 else None
    if refused is not None:
        usd, reason = None, f"token counts refused: {refused}"
    else:
        usd, reason = _request_cost(requests, model) if parts is not None else prices.cost(tokens, model)
    outcome = ctx["index"].outcome
    turn = {"turn": rec.ordinal, "outcome": OUTCOME_NAMES[outcome[i]] if i < len(outcome) else "open",
            "model": model, "day": _day(t1 if t1 is not None else t0 if t0 is not None else ctx["created"]),
            "started_at": started, "completed_at": completed, "wall_seconds": seconds, "tokens": tokens,
            "tools": calls.render(rec.tools), "cost_usd": usd}
    if reason is not None:
        turn["cost_reason"] = reason
    if refused is not None:
        turn["usage_error"] = refused
    turn["agent_cost_usd"] = None if rec.agent_cost is None else round(rec.agent_cost, 8)
    if rec.agent is not None:
        turn["agent"] = rec.agent
    if parts is not None:
        turn["requests"] = len(requests)
        if len(parts) > 1 and refused is None:
            turn["by_model"] = [_model_part(name, counts, [r for r in requests if (
                r.get("model") if type(r.get("model")) is str and r["model"] else model) == name], model)
                for name, counts, _n in parts]
    return turn


def _last_model(requests: list | None) -> str | None:
    for req in reversed(requests or ()):
        if isinstance(req, dict) and type(req.get("model")) is str and req["model"]:
            return req["model"]
    return None


def _model_part(name: str | None, tokens: dict, requests: list, model: str | None) -> dict:
    usd, reason = _request_cost(requests, model)
    part = {"model": name, "requests": len(requests), "tokens": tokens, "cost_usd": usd}
    if reason is not None:
        part["cost_reason"] = reason
    return part


def render(session_id: str, fold, about: dict, times: dict, created_at: str, source: dict) -> bytes:
    """The bytes of ``usage.json`` (pretty JSON, see the module docstring). Incremental: the
    turns before the last are rendered once per fold and ``index/about.json`` version (and, for a
    session no capture made, per version of the recorded arrival times)."""
    from memfs.views.memory import indented  # (the views package, loaded only when a view is rendered)

    agent = about.get("agent") if type(about.get("agent")) is str else fold.origin.agent
    project = about.get("project") or about.get("cwd")
    session_model = about.get("model") if type(about.get("model")) is str else None
    started_at = about.get("started_at")
    native = type(about.get("conversation_id")) is not str
    ctx = {"about": about, "agent": agent, "model": session_model, "native": native, "times": times,
           "index": fold.turns.index,
           "created": (parse_rfc3339(started_at) if type(started_at) is str else None) or (
               parse_rfc3339(created_at) if created_at else None)}
    cache = _TURNS.get(fold)
    if cache is None or not cache.valid(about, times):
        cache = _TURNS[fold] = _Turns(about)
    ctx["used"] = cache.used
    records = fold.records
    for i in range(len(cache.chunks), len(records) - 1):
        turn = _turn(records[i], i, ctx)
        cache.chunks.append(indented(turn, 2))
        cache.sums.add(turn, records[i].tools)
    chunks, sums = cache.chunks, cache.sums
    if records:
        ctx["used"] = {}  # the last turn is rendered afresh each time
        last = _turn(records[-1], len(records) - 1, ctx)
        chunks = [*chunks, indented(last, 2)]
        sums = sums.copy()
        sums.add(last, records[-1].tools)
    days = [{"day": day, "model": model, "turns": n, "tokens": tokens, **cost.fields(count=False),
             **refused.fields(count=False)}
            for (day, model), (n, tokens, cost, refused) in sorted(sums.rows.items(), key=lambda kv: (kv[0][0] or "",
                                                                                            kv[0][1] or ""))]
    total = {"turns": sums.turns, "tokens": sums.tokens or normal_tokens([0] * 5, agent),
             "wall_seconds": round(sums.wall, 3), "tools": calls.render(sums.tools), **sums.cost.fields(),
             **sums.refused.fields(), "models": sums.models,
             "agent_cost_usd": None if fold.agent_cost is None else round(fold.agent_cost, 8)}
    doc = {"session_id": session_id, "version": VERSION, "agent": agent,
           "project": project if type(project) is str else None, "model": session_model,
           "prices": prices.table().describe(), "total": total, "days": days, "source": source, "turns": _SLOT}
    head = indented(doc, 0)
    body = b"[\n    " + b",\n    ".join(chunks) + b"\n  ]" if chunks else b"[]"
    return head.replace(_SLOT_JSON, body, 1) + b"\n"


_SLOT = "\x00turns\x00"
_SLOT_JSON = orjson.dumps(_SLOT)
