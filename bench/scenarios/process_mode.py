"""process_mode: what running handlers in child processes costs beside threads.

One `runworker --burst --concurrency 4` drains M no-op items (`bench.noop`)
and M/25 items of 50 ms (`bench.wait`, a sleep), once with `--execution
thread` (the default) and once with `--execution process`. Each drain is
gated (`bench.drain.gate_and_start`), and in process mode the gate opens only
once the worker's children have started and gone idle, so the children's
start-up (a fresh interpreter setting Django up) is outside the figures, as
the worker's own start-up is. Client CPU counts the worker and its children
up to the last completion (not their shutdown). No target: the
figures say what the choice costs (docs/how-to/execution-modes.md). Jobs/s is
read from the rows (first start to last completion), as `throughput` does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import progress, wait_for
from bench.context import Bench
from bench.drain import cost_per_job, gate_and_start
from bench.measure import proc_cpu_s
from bench.report import Row

CONCURRENCY = 4
SLOW_SECONDS = 0.05
WORK = {"noop": ("bench.noop", None), "50ms": ("bench.wait", {"seconds": SLOW_SECONDS})}


def _children(pid: int) -> list[int]:
    """The live child processes of `pid` (Linux: every thread's `children`)."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(p) for p in (task / "children").read_text().split()]
    except OSError:
        pass
    return found


def _cpu(pid: int) -> float:
    """CPU seconds of a worker and its live children, now."""
    return proc_cpu_s(pid) + sum(proc_cpu_s(child) for child in _children(pid))


def _settled(pids: list[int]) -> bool:
    """Whether these processes have stopped using CPU (started and idle)."""
    before = [proc_cpu_s(p) for p in pids]
    time.sleep(0.3)
    return [proc_cpu_s(p) for p in pids] == before


def _drain(bench: Bench, label: str, execution: str, m: int) -> dict[str, Any]:
    work_type, data = WORK[label]
    progress(f"  runworker --execution {execution}: {m} items of {label}")
    bench.reset()
    from leasing import enqueue_many

    enqueue_many(
        [{"task_id": f"task-{i}", "work_type": work_type, "input_data": data} for i in range(m)]
    )
    bench.checkpoint()
    at_gate: dict[str, Any] = {}

    def ready(procs: list[Any]) -> None:
        if execution == "process":
            pid = procs[0].pid
            wait_for(lambda: len(_children(pid)) >= CONCURRENCY, 120, "the children", 0.05)
            wait_for(lambda: _settled(_children(pid)), 120, "the children to settle", 0.0)
        at_gate["cpu"] = _cpu(procs[0].pid)
        at_gate["xact"] = bench.xact_commits()

    def spawn(_i: int) -> Any:
        return bench.runworker(
            "--burst",
            "--concurrency",
            str(CONCURRENCY),
            "--execution",
            execution,
            name=f"process-mode-{execution}-{label}",
        )

    procs = gate_and_start(bench, 1, f"runworker --execution {execution}", spawn, ready)
    start = time.perf_counter()
    # The CPU is read once every item completed, before the worker's shutdown (its
    # children's exit included), so neither mode's figure carries a fixed cost.
    done = "SELECT count(*) FROM work_items WHERE status = 'completed' AND work_type = %s"
    wait_for(lambda: bench.one(done, [work_type]) >= m, max(120.0, m / 20), "the drain", 0.02)
    client_cpu = _cpu(procs[0].pid) - at_gate["cpu"]
    bench.procs.wait_all(procs, timeout_s=120.0, what="process_mode drain")
    wall = time.perf_counter() - start
    bench.check_exit(procs, "process_mode drain")
    stats = bench.drain_stats(work_type=work_type)
    result = {
        "work": label,
        "execution": execution,
        "items": m,
        "completed": stats["completed"],
        # From the first start to the last completion (the rows), and from the gate to
        # the worker's exit (wall: its shutdown, children included).
        "jobs_per_s": stats["jobs_per_s"],
        "wall_jobs_per_s": round(stats["completed"] / wall, 1) if wall > 0 else None,
        **cost_per_job(bench, stats["completed"], client_cpu, at_gate["xact"]),
    }
    progress(f"    {result['jobs_per_s']} jobs/s, {result['client_cpu_us_per_job']} us CPU/job")
    return result


def run(bench: Bench) -> dict[str, Any]:
    # At least 2,000: the client CPU is read in clock ticks (10 ms), which a quick
    # run's few hundred no-op items in a thread can stay under.
    noop_items = max(2_000, min(bench.sizes.items, 5_000))
    sizes = {"noop": noop_items, "50ms": max(40, noop_items // 25)}
    runs = [
        _drain(bench, label, execution, sizes[label])
        for label in WORK
        for execution in ("thread", "process")
    ]
    return {"concurrency": CONCURRENCY, "runs": runs}


def rows(r: dict[str, Any]) -> Iterator[Row]:
    by = {(run["work"], run["execution"]): run for run in r["runs"]}
    for label in WORK:
        thread, process = by.get((label, "thread")), by.get((label, "process"))
        if thread is None or process is None:
            continue
        yield Row(
            f"process_mode {label} c{r['concurrency']}: jobs/s (rows) thread | process",
            f"{thread['jobs_per_s']} | {process['jobs_per_s']}",
            absolute=True,
        )
        yield Row(
            f"  {label}: client CPU us/job thread | process",
            f"{thread['client_cpu_us_per_job']} | {process['client_cpu_us_per_job']}",
        )
