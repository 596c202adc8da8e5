"""The usage contributions kept in the store catalog (SPEC §12, §14): reports are queries over
them, the catalog is a cache (deleting it changes no figure), a report reads a session
again only when it changed, and ``memfs sessions`` shows the same record's totals."""

from __future__ import annotations

import json
from pathlib import Path

from memfs.usage import periods, query, report, reporting
from memfs.usage.utcdays import BY

from mounting import event
from test_usage import import_all, native, run

GROUPINGS = [("day", "UTC"), ("week", "Asia/Kolkata"), ("month", "America/St_Johns"), ("model", "UTC"),
             ("project", "UTC"), ("agent", "UTC"), ("session", "UTC")]


def store_of_every_agent(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    for agent in ("claude", "codex", "gemini"):
        import_all(store, agent)
    native(store, "old", event("turn.started"),
           event("turn.completed", model="acme-coder-1", completed_at="2025-01-02T03:04:05Z",
                 usage={"input_tokens": 7, "output_tokens": 3}))  # no price: the reason is carried
    native(store, "late", event("turn.started"),
           event("turn.completed", model="gpt-5", completed_at="2026-12-03T23:50:00Z", usage={"input_tokens": 5}),
           event("turn.started"),
           event("turn.completed", model="gpt-5", completed_at="2026-12-04T00:20:00Z", usage={"input_tokens": 6}))
    return store


def reports(store: Path) -> list[dict]:
    return [json.loads(run("usage", "--store", str(store), "--by", by, "--tz", tz, "--json")) for by, tz in GROUPINGS]


def test_reports_are_equal_before_and_after_deleting_the_catalog(tmp_path):
    store = store_of_every_agent(tmp_path)
    before = reports(store)
    assert before[0]["totals"]["tokens"]["total"] == 3 * 3375 + 10 + 11
    assert [r["day"] for r in before[0]["rows"]] == ["2025-01-02", "2026-12-03", "2026-12-04"]
    for suffix in ("", "-wal", "-shm"):
        (store / ".memfs" / f"catalog.sqlite{suffix}").unlink(missing_ok=True)
    assert reports(store) == before
    # the queries give what the Python fold over the same contributions gives, field for field
    contribs = reporting.contributions(store).values()
    for (by, tz), doc in zip(GROUPINGS, before):
        opts = periods.Options(by=by, tz=periods.zone(tz))
        assert periods.report(contribs, opts) == doc == query.report(store, opts)
    opts = periods.Options(by="day", tz=periods.zone("Europe/Paris"), last=2, agent="unknown")
    assert periods.report(contribs, opts) == query.report(store, opts)


def test_a_report_reads_a_session_again_only_when_it_changed(tmp_path):
    store = store_of_every_agent(tmp_path)
    first = query.report(store, periods.Options(by="agent"))
    computed = reporting.computed
    assert query.report(store, periods.Options(by="agent")) == first
    assert reporting.computed == computed  # every contribution came from the catalog
    native(store, "late", event("turn.started"),
           event("turn.completed", model="gpt-5", completed_at="2026-12-05T00:00:00Z", usage={"input_tokens": 100}))
    again = query.report(store, periods.Options(by="agent"))
    assert reporting.computed == computed + 1  # the one session appended to
    assert again["totals"]["tokens"]["total"] == first["totals"]["tokens"]["total"] + 100


def test_an_import_keeps_its_usage_and_the_report_reads_no_log(tmp_path):
    store = tmp_path / "store"
    for agent in ("claude", "codex", "gemini"):
        import_all(store, agent)  # (another process: memfs import)
    computed = reporting.computed
    doc = query.report(store, periods.Options(by="agent"))
    assert reporting.computed == computed  # every contribution was kept by the import's commit
    assert {r["agent"]: r["tokens"]["total"] for r in doc["rows"]} == {"claude": 3375, "codex": 3375, "gemini": 3375}
    for suffix in ("", "-wal", "-shm"):  # the same from the logs, the catalog deleted (another process)
        (store / ".memfs" / f"catalog.sqlite{suffix}").unlink(missing_ok=True)
    assert json.loads(run("usage", "--store", str(store), "--by", "agent", "--json")) == doc


def test_the_listing_and_a_report_read_one_record_of_a_session(tmp_path):
    store = store_of_every_agent(tmp_path)

    def listed() -> dict:  # memfs sessions --json: tokens and cost per session
        return {s["name"]: (s["tokens"], s["cost_usd"]) for s in json.loads(run("sessions", "--store", str(store),
                                                                               "--json"))}

    def agree(shown: dict, doc: dict) -> None:
        assert {r["session"]: r["tokens"]["total"] for r in doc["rows"]} == {n: t for n, (t, _) in shown.items()}
        for r in doc["rows"]:  # (the report sums turns, the listing the session's total: the same up to rounding)
            cost = shown[r["session"]][1]
            assert (r["cost_usd"] is None, round(r["cost_usd"] or 0, 6)) == (cost is None, round(cost or 0, 6))

    first = listed()
    assert first["late"] == (11, first["late"][1]) and first["old"] == (10, None)  # (old: a model with no price)
    native(store, "late", event("turn.started"),  # another process appends a turn
           event("turn.completed", model="gpt-5", completed_at="2026-12-05T00:00:00Z", usage={"input_tokens": 100}))
    shown = listed()  # (another process: the listing computes the changed session's contribution and keeps it)
    assert shown["late"][0] == 111 and shown["late"][1] > first["late"][1]
    assert {n: v for n, v in shown.items() if n != "late"} == {n: v for n, v in first.items() if n != "late"}
    computed = reporting.computed
    doc = query.report(store, periods.Options(by="session"))
    assert reporting.computed == computed  # the report read the record the listing kept: no session read again
    agree(shown, doc)
    native(store, "late", event("turn.started"),  # and the other way: the report keeps, the listing reads it
           event("turn.completed", model="gpt-5", completed_at="2026-12-05T01:00:00Z", usage={"input_tokens": 1000}))
    doc = query.report(store, periods.Options(by="session"))
    assert reporting.computed == computed + 1  # the one session appended to
    _, infos, totals = reporting.listed(store)
    assert reporting.computed == computed + 1  # the listing read the report's record
    shown = listed()
    assert shown["late"][0] == 1111 == totals["late"]["tokens"]["total"] and len(infos) == len(shown)
    agree(shown, doc)


def test_the_utc_report_sums_the_sessions_own_day_rows_where_the_catalog_keeps_them(tmp_path):
    store = store_of_every_agent(tmp_path)
    native(store, "old2", event("turn.started"),  # the same model with no price, in a second session
           event("turn.completed", model="acme-coder-1", completed_at="2025-01-02T05:00:00Z",
                 usage={"input_tokens": 1}))
    views = {n: reporting.usage_of(store, n) for n in sorted(p.name for p in store.iterdir() if p.name[0] != ".")}

    def by_hand(by: str, since: str | None = None) -> list:  # each session's usage.json days, summed here
        groups: dict = {}
        for name, view in views.items():
            for day in view["days"]:
                if since is not None and (day["day"] is None or day["day"] < since):
                    continue
                key = {"day": day["day"], "model": day["model"], "project": view["project"], "agent": view["agent"],
                       "session": name}[by]
                g = groups.setdefault(key, {"sessions": set(), "turns": 0, "total": 0, "usd": 0.0, "unpriced": 0})
                g["sessions"].add(name)
                g["turns"] += day["turns"]
                g["total"] += day["tokens"]["total"]
                if day["cost_usd"] is None:
                    g["unpriced"] += 1
                else:
                    g["usd"] += day["cost_usd"]
        return sorted(((str(k), len(g["sessions"]), g["turns"], g["total"],
                        None if g["unpriced"] else round(g["usd"], 6), g["unpriced"]) for k, g in groups.items()),
                      key=str)

    def shown(doc: dict, by: str) -> list:
        return sorted(((str(r[by]), r["sessions"], r["turns"], r["tokens"]["total"], r["cost_usd"],
                        int(r["cost_reason"].rsplit("(", 1)[1].split()[0]) if r["cost_usd"] is None else 0)
                       for r in doc["rows"]), key=str)

    before = {}
    for by in BY:
        doc = before[by] = report(store, by)
        assert shown(doc, by) == by_hand(by), by
        assert doc["totals"]["sessions"] == len(views) and doc["totals"]["cost_usd"] is None
        assert "no price" in doc["totals"]["cost_reason"] and "(2 of the day-and-model rows)" in doc["totals"]["cost_reason"]
    assert [r["day"] for r in before["day"]["rows"]] == sorted(r["day"] for r in before["day"]["rows"])
    totals = [r["tokens"]["total"] for r in before["model"]["rows"]]
    assert totals == sorted(totals, reverse=True)  # (most tokens first)
    recent = report(store, "day", since=1764806400)  # 2025-12-04: the 2025-01-02 rows are left out
    assert shown(recent, "day") == by_hand("day", "2025-12-04") and recent["totals"]["cost_usd"] is not None
    for suffix in ("", "-wal", "-shm"):  # the same from the logs, the catalog deleted
        (store / ".memfs" / f"catalog.sqlite{suffix}").unlink(missing_ok=True)
    assert {by: report(store, by) for by in BY} == before
