"""``memfs usage``'s text tables (SPEC §12): a report of :mod:`memfs.usage.periods` or
:mod:`memfs.usage.blocks` as rows of cells, and the notes under them.

A cost is ``$x`` when every turn of the row is priced; ``$x*`` when some are not (the priced
part; the notes name each unpriced model and why); ``-`` when none is; followed by ``(agent
says $y)`` when the agent's own bill for the row's turns (Claude Code's cost) differs from it by
more than 1%. Token cells are ``-``
where token counts were refused (:mod:`memfs.counts`): an incomplete sum is never shown.
"""

from __future__ import annotations

from memfs.store.listing import usd

COLUMNS = ("input", "output", "cache_creation", "cached_input", "total")
TITLES = ("INPUT", "OUTPUT", "CACHE WRITE", "CACHE READ", "TOTAL TOKENS")
COMPACT = (("input", "INPUT"), ("output", "OUTPUT"))
MARK = "*"


def cost(r: dict) -> str:
    return _cost(r) + (f" (agent says {usd(r['agent_cost_usd'])})" if r.get("agent_cost_differs") else "")


def _cost(r: dict) -> str:
    if r.get("cost_usd") is not None:
        return usd(r["cost_usd"])
    priced = r.get("priced_cost_usd")
    if priced is None or r.get("unpriced_turns", 0) >= r.get("turns", 0):
        return "-"
    return usd(priced) + MARK


def _tokens(r: dict, keys) -> list[str]:
    return ["-" if r.get("usage_error") else f"{r['tokens'][k]:,}" for k in keys]


def rows(doc: dict, compact: bool = False, breakdown: bool = False) -> tuple[list[list[str]], set[int]]:
    """The table (a header, the rows, a TOTAL line) and the indexes of its right-aligned columns:
    the key (and a block's status), the models (not in ``--compact``, not by model or block),
    sessions and turns (not in ``--compact``), the tokens, the cost; ``breakdown``: one line per
    model under each row."""
    by = doc["by"]
    block = by == "block"
    keys = [k for k, _ in COMPACT] if compact else list(COLUMNS)
    titles = [t for _, t in COMPACT] if compact else list(TITLES)
    models = not compact and by not in ("model", "block")
    lead = 1 + block + models  # the left-aligned columns
    counts = [] if compact else ["TURNS"] if block else ["SESSIONS", "TURNS"]
    out = [[by.upper(), *(["STATUS"] if block else []), *(["MODELS"] if models else []), *counts, *titles, "COST"]]
    for r in doc["rows"] if "rows" in doc else doc["blocks"]:
        out.append(_line(by, r, keys, models, compact))
        if breakdown and by != "model":
            for part in r.get("modelBreakdowns") or ():
                tokens = {"input": part["inputTokens"], "output": part["outputTokens"],
                          "cache_creation": part["cacheCreationTokens"], "cached_input": part["cacheReadTokens"]}
                sub = {**part, "tokens": {**tokens, "total": sum(tokens.values())}}
                out.append([f"  └ {part['modelName'] or '-'}", *[""] * (lead - 1 + len(counts)),
                            *_tokens(sub, keys), cost(sub)])
    out.append(_line(by, {by: "TOTAL", **doc["totals"]}, keys, models, compact))
    return out, set(range(lead, len(out[0])))


def _line(by: str, r: dict, keys, models: bool, compact: bool) -> list[str]:
    if by == "block":
        start = r.get("startTime")
        status = "gap" if r.get("isGap") else "ACTIVE" if r.get("isActive") else "done" if start else ""
        line = [start[:16].replace("T", " ") if start else "TOTAL", status]
        if r.get("isGap"):  # no activity: nothing to count
            return [*line, *[""] * (len(keys) + 1 + (not compact))]
        return [*line, *([] if compact else [str(r["turns"])]), *_tokens(r, keys), cost(r)]
    key = r[by]
    line = [str(key) if key is not None else "-"]
    if models:
        line.append(", ".join(r.get("modelsUsed") or ()) or "-")
    if not compact:
        line += [str(r["sessions"]), str(r["turns"])]
    return [*line, *_tokens(r, keys), cost(r)]


def notes(doc: dict) -> list[str]:
    """What the table's markers mean, the zone, the prices."""
    out = []
    table = doc.get("prices")
    zone = f"; times in {doc['timezone']}" if doc.get("timezone") else ""
    if table is not None:
        out.append(f"prices: {table['name']} ({table['date']})"
                   + (f", overridden for {', '.join(table['overrides'])}" if table["overrides"] else "") + zone)
    elif zone:
        out.append(zone[2:])
    totals = doc["totals"]
    if totals.get("unpriced"):
        named = "; ".join(f"{model}: {reason}" for model, reason in totals["unpriced"].items())
        out.append(f"cost '{MARK}': the priced part only; no price for {named}")
    rows = doc["rows"] if "rows" in doc else doc.get("blocks") or ()
    if totals.get("agent_cost_differs") or any(r.get("agent_cost_differs") for r in rows):
        out.append("'agent says $x': the agent's own bill (Claude Code's cost) for those turns, more than 1% "
                   "from the cost computed from the price table")
    refused = totals.get("usage_error")
    if refused:
        out.append(f"tokens '-': token counts refused: {refused}")
    if doc.get("tokenLimit") is not None:
        out.append(f"token limit: {doc['tokenLimit']:,}")
    return out
