"""How ``scripts/bench_scale.py`` measures and reports: walls of commands, reads through a mount,
waiting for a change with a deadline, the MCP client, and the Markdown table of figures beside
their baselines and goals."""

from __future__ import annotations

import errno
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wall(cmd: list[str], check: bool = True) -> float:
    """Seconds from starting ``cmd`` to its exit (output discarded)."""
    t = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    took = time.perf_counter() - t
    if check and proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[2:])} exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-500:]}")
    return took


def read(path: Path) -> bytes:
    """open, read to EOF, close (what ``cat`` does, without spawning it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def search_once(mnt: Path, query: str, text: bool = False, deadline: float = 900.0):
    """A root search through the mount: its seconds (a query answered ``ETIMEDOUT`` while the
    index warms, or ``EAGAIN`` while it is built elsewhere, is asked again, up to ``deadline``),
    or with ``text`` its results ("" on an error)."""
    t = time.perf_counter()
    while True:
        try:
            data = read(mnt / "search" / query)
            break
        except OSError as exc:
            if exc.errno not in (errno.ETIMEDOUT, errno.EAGAIN) or time.perf_counter() - t > deadline:
                if text:
                    return ""
                raise
    return data.decode(errors="replace") if text else time.perf_counter() - t


def poll(checks: dict[str, Callable[[], bool]], since: float, timeout: float) -> dict[str, float | None]:
    """Seconds from ``since`` (a ``perf_counter``) until each check first holds; None for one
    that did not within ``timeout``. Each check is asked in a thread of its own, so a slow one
    (a listing of 100,000 entries) does not delay the others'."""
    seen: dict[str, float | None] = dict.fromkeys(checks)
    deadline = since + timeout

    def wait(what: str, check: Callable[[], bool]) -> None:
        while time.perf_counter() < deadline:
            try:
                if check():
                    seen[what] = time.perf_counter() - since
                    return
            except OSError:
                pass
            time.sleep(0.005)

    threads = [threading.Thread(target=wait, args=item, daemon=True) for item in checks.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return seen


def mcp_list_sessions(store: Path, errlog: Path) -> dict:
    """``list_sessions`` from the MCP SDK's client over stdio against ``memfs mcp --store``:
    the server's start to an initialized session, the first call, then medians of 3 (all,
    and since 1d). The server is killed by pid afterwards, whatever happened."""
    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "memfs", "mcp", "--store", str(store)],
                                   cwd=str(ROOT))
    r: dict = {}

    async def call(client, arguments: dict) -> float:
        t = time.perf_counter()
        result = await client.call_tool("list_sessions", arguments)
        took = time.perf_counter() - t
        if result.is_error:
            raise RuntimeError(f"list_sessions: {result.content[0].text}")
        return took

    async def main() -> None:
        with open(errlog, "w") as err:
            t = time.perf_counter()
            async with Client(stdio_client(params, errlog=err), read_timeout_seconds=600) as client:
                r["start_s"] = time.perf_counter() - t
                r["all_first_s"] = await call(client, {})
                r["all_s"] = statistics.median([await call(client, {}) for _ in range(3)])
                r["since_s"] = statistics.median([await call(client, {"since": "1d"}) for _ in range(3)])

    try:
        anyio.run(main)
    finally:
        for line in errlog.read_text(errors="replace").splitlines() if errlog.exists() else []:
            if line.startswith("memfs mcp: serving") and "pid " in line:
                try:
                    os.kill(int(line.rsplit("pid ", 1)[1].rstrip(")")), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
    return r


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "s":
        return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "MB/s":
        return f"{value:.1f} MB/s"
    return f"{value:,.0f}{' ' + unit if unit else ''}"


class Table:
    """The report's rows: a figure, its baseline, their ratio, the goal and whether it is met.
    A goal is judged at its own size (``goal_size``; None: at any); a smaller store's row shows
    in parentheses whether it already meets it, a larger one's is reported beside."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, n: int | None, what: str, value: float | None, base: float | None, base_label: str,
            goal: float | None, goal_size: int | None = None, unit: str = "s", higher: bool = False) -> None:
        met = None if goal is None or value is None else (value >= goal if higher else value <= goal)
        if goal is not None and value is None:
            met = False
        self.rows.append({"sessions": n, "what": what, "value": value, "base": base, "base_label": base_label,
                          "goal": goal, "goal_size": goal_size, "unit": unit, "higher": higher, "met": met})

    @staticmethod
    def verdict(row: dict) -> str:
        if row["met"] is None:
            return "—"
        word = "yes" if row["met"] else "no"
        if row["goal_size"] is None or row["sessions"] == row["goal_size"]:
            return word if row["met"] else f"**{word}**"
        return f"({word})" if row["sessions"] < row["goal_size"] else "—"

    def markdown(self, python_s: float) -> str:
        lines = [f"Bare `python -c pass` of the same interpreter: {python_s * 1000:.0f} ms (in every command's wall). "
                 "Goals at 10,000 sessions unless the goal says otherwise; a smaller store's verdict is in parentheses.",
                 "", "| sessions | measure | memfs | baseline | ratio | goal | met |", "|---:|---|---:|---|---:|---|---|"]
        for r in self.rows:
            unit = r["unit"]
            value = fmt(r["value"], unit) if r["value"] is not None else "not seen in time"
            base = f"{fmt(r['base'], unit)} ({r['base_label']})" if r["base"] is not None else r["base_label"]
            ratio = f"{r['value'] / r['base']:.2f}×" if r["base"] and r["value"] is not None else ""
            goal = ""
            if r["goal"] is not None:
                goal = f"{'≥' if r['higher'] else '≤'} {fmt(r['goal'], unit)}"
                goal += f" at {r['goal_size']:,}" if r["goal_size"] else ""
            size = f"{r['sessions']:,}" if r["sessions"] else "—"
            lines.append(f"| {size} | {r['what']} | {value} | {base} | {ratio} | {goal} | {self.verdict(r)} |")
        return "\n".join(lines)

    def goals(self) -> dict:
        """The rows judged at their goal's size, as ``bench.py``'s goal rows."""
        out = {}
        for r in self.rows:
            if r["met"] is not None and (r["goal_size"] is None or r["sessions"] == r["goal_size"]):
                where = f" at {r['sessions']:,} sessions" if r["sessions"] else ""
                what = r["what"].split(" (")[0] if r["sessions"] is None else r["what"]  # (the sizes go in measured)
                goal = f"{'≥' if r['higher'] else '≤'} {fmt(r['goal'], r['unit'])}"
                out[f"scale: {what}{where} {goal}"] = {
                    "measured": (fmt(r["value"], r["unit"]) if r["value"] is not None else "not seen in time")
                    + (f" ({r['what'].split(' (', 1)[1]}" if what != r["what"] else ""),
                    "met": bool(r["met"])}
        return out
