"""docs/fault-run.md: what a fault run is, and the figures and verdict of one run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .checker import PROPERTIES
from .injector import FAULTS

if TYPE_CHECKING:
    from .report import Report

HOW_CHECKED = {
    "stale_completion": (
        "Every completed item has exactly one completion in the journal, under the newest "
        "token that claimed it, and no claim after it. Its stored output is the completing "
        "run's stamp (`{token, worker}`, returned by every handler), so an output written by "
        "a run whose lease had moved on would carry its older token. Every completion and "
        "claim a worker was told of (signal records) is the one the journal has, with "
        "that holder."
    ),
    "double_effect": (
        "Every `run_once(..., atomic=True)` effect inserts one ledger row in the transaction "
        "that records its key; no key has two rows, and each row's (item, token, worker) is "
        "a lease the journal shows the database granted."
    ),
    "not_terminal": (
        "After the faults stop, the producer and schedulers are stopped and the workers and "
        "sweeps get a bounded settle time; then every item is `completed` or `failed`."
    ),
    "renewal_past_cap": (
        "In every journal row of a lease, expiry <= deadline; every claim's deadline is at "
        "most its type's cap after the claim; no renewal changed a deadline or extended a "
        "lease whose expiry had already passed at the renewal's statement time; no renewal "
        "a worker was told of went past its lease's deadline."
    ),
    "limit_exceeded": (
        "The claims and lease ends of the limited queue are replayed in the order the "
        "database wrote them: never more (item, token) leases in progress than the limit."
    ),
    "double_tick": (
        "The schedule's items, grouped by the tick in their input: one item per tick, "
        "with two schedulers running (one of them through pgbouncer with its clock skewed)."
    ),
    "dependency_order": (
        "No dependent's claim was written before its dependency's completion (a dependency "
        "that never completed: the dependent was never claimed)."
    ),
    "unrecovered_expiry": (
        "Every lease that ended after its expiry ended (the sweep recovering it, or its "
        "holder) within the bound of its expiry (`RECOVERY_BOUND`, "
        "tests/faults/workload.py): the sweep passes every second, and the bound leaves "
        "room for a restarting database or a killed sweep. Semantics: every expired lease "
        "is recovered by the next sweep pass."
    ),
}

FAULT_WORDS = {
    "kill_worker": "SIGKILL of a worker (restarted after 0.5 s)",
    "kill_sweep": "SIGKILL of a recovery sweep (restarted)",
    "kill_scheduler": "SIGKILL of a scheduler (restarted)",
    "terminate_backends": "`pg_terminate_backend` of 1-3 of the run's backends",
    "terminate_listeners": "`pg_terminate_backend` of workers' LISTEN sessions",
    "restart_postgres": "PostgreSQL restarted (`pg_ctlcluster restart`: fast shutdown)",
    "crash_postgres": "PostgreSQL crashed (SIGKILL of the postmaster and every backend), started",
    "restart_pgbouncer": "pgbouncer (transaction mode) stopped and started",
    "skew_clock": "the skewed worker restarted with its skew reversed",
}


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def markdown(report: Report) -> str:
    f = report.figures
    verdict = "passed" if report.passed else "FAILED"
    out = [
        "# The fault run: a history checker under faults",
        "",
        "`make test-faults` runs real `runworker`, `recoverysweep` and `runscheduler` "
        "processes on a throwaway PostgreSQL 15 cluster while an injector kills them, ends "
        "their database sessions, restarts PostgreSQL and pgbouncer and skews clocks; "
        "every claim, renewal, completion and `run_once` effect is recorded with its "
        "(item, token), and afterwards a checker proves from those records and the "
        "database that the promises below held. This page is written by the run itself "
        "(`tests/faults/document.py`); the figures are those of the last full run.",
        "",
        "## How to run it",
        "",
        "- `make test-faults`: the full run (`FAULTS_SECONDS`, default 240 s of faults).",
        "- `make test-faults-short`: 75 s of faults, what CI runs (under 3 minutes).",
        "- Knobs: `FAULTS_SECONDS`, `FAULTS_SETTLE_SECONDS` (the most the system gets to "
        "finish after the faults, default 90), `FAULTS_SEED` (the injector's and the "
        "producer's random choices). Needs root and Debian's PostgreSQL tools and pgbouncer "
        "(`scripts/ha/ensure-packages.sh`), like `make test-ha`; the shared server is never "
        "touched.",
        "- Left in `artifacts/faults/`: each process's log (`logs/`), its signal records "
        "(`records/`), the injector's log of every fault (`faults.log`), the cluster's log, "
        "the journal, the items and the ledger as CSV (`database/`) and this report: a "
        "violation names its item and token, to be followed through those files.",
        "- The checker's own tests (`tests/unit/test_fault_checker.py`, part of `make test`) plant "
        "one violation of each property in a made-up history and see it fail.",
        "",
        "## What runs",
        "",
        f"- Four workers (`runworker --concurrency {f['concurrency']}`): two connect directly, "
        "one of them with its wall clock "
        f"{f['skew']:g} s off; two go through pgbouncer in transaction mode "
        "(their LISTEN sessions direct, `LISTEN_DATABASE`).",
        "- Two recovery sweeps (one direct, one pooled) and two schedulers (`runscheduler`, one "
        f"direct, one pooled with its clock -{f['skew']:g} s off) running one schedule "
        "`every: 1` second.",
        "- A producer enqueueing through the public API every half second: plain items; items "
        'whose handler fails at random (retried); unique keys (`unique_while="pending"` and '
        '`"unfinished"`, keys from pools of four, so they collide); a parent with two '
        'dependents (`on_dependency_failure="fail"`); an item of queue `limited` '
        f"(`QUEUE_LIMITS` {f['queue_limits']}); slow items of six steps with checkpoints, "
        "longer than a lease; items whose type caps a lease at "
        f"{', '.join(f'{t} {s:g} s' for t, s in f['caps'].items())}, whose first runs often "
        "outlive it (timed out, their late result refused).",
        "- Leases of 4 s renewed every second, a sweep every second, up to 12 retries with a "
        "backoff of at most 2 s.",
        "- Every handler's effect is one row inserted through `run_once(key, ..., atomic=True)`.",
        "",
        "## The faults",
        "",
        "One every 1-3 s, each kind once first, then drawn at random (seeded):",
        "",
        *_table(
            ("fault", "what", "injected in the last run"),
            [(k, FAULT_WORDS[k], report.faults.get(k, 0)) for k in FAULTS],
        ),
        "",
        "What they did: "
        + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(report.fault_effects.items()))
        + f". Processes started {sum(f['process_starts'].values())} times in all, "
        f"{f['killed_exits']} of them after a SIGKILL, and {f['crashes']} crashes: a worker, "
        "sweep or scheduler that exits by itself fails the run (they wait out outages; only "
        "a worker's exit 75, a restart after too many abandoned runs, is by design). Once "
        f"the faults were over, {f['clean_stops']} workers, sweeps and schedulers were "
        "stopped by SIGTERM and exited 0 (a hang or another exit code fails the run; a "
        "process restarted just before is first given 15 s to start, since Python dies of "
        "a SIGTERM that comes before the command's own code runs).",
        "",
        "## What is recorded",
        "",
        "- **The journal**: a trigger on `work_items` (installed on the throwaway database "
        "only) appends every change of status, token or lease expiry, with the database's "
        "clock, in the transaction that made it: it holds a change exactly when it committed, "
        "whatever happened to the process.",
        "- **The ledger**: one row per `run_once` effect, with its key, item, token and worker.",
        "- **Stamps**: each handler returns `{token, worker}`, stored as the item's output.",
        "- **Signal records**: each process appends what leasing's signals tell it "
        "(`lease_acquired`, `lease_renewed`, `lease_released`, `lease_expired`) to a file of "
        "its own. A process killed between a commit and its record loses that record, so "
        "records are checked against the journal, never the other way round.",
        "",
        "## What is checked",
        "",
        *_table(
            ("property", "how", "violations"),
            [
                (title, HOW_CHECKED[name], len(report.violations[name]))
                for name, title in PROPERTIES.items()
            ],
        ),
        "",
        f"## The last full run: {verdict}",
        "",
        f"{f['finished_at']}: {f['seconds']:g} s of faults (seed {f['seed']}), then "
        f"{f['settle_seconds']} s to settle "
        f"({'every item ended' if f['settled'] else 'items were left unfinished'}); "
        f"{f['wall_seconds']} s in all, on a 2-CPU machine.",
        "",
        *_table(
            ("", ""),
            [
                ("items", f"{f['items']}: {_statuses(f['statuses'])}"),
                ("superseded (a unique key held by another item)", f["superseded"]),
                ("claims", f"{f['claims']} ({f['reclaimed_items']} items claimed more than once)"),
                ("completions", f["completions"]),
                ("renewals that moved an expiry", f["renewals"]),
                (
                    "leases ended back to pending / failed",
                    f"{f['back_to_pending']} / {f['ended_failed']}",
                ),
                ("recoveries by the sweep (recorded)", f["sweep_recoveries"]),
                ("effects (ledger rows / keys)", f"{f['effects']} / {f['effect_keys']}"),
                ("effects committed after their lease ended", f["late_effects"]),
                (
                    "longest an expired lease waited for the sweep",
                    f"{f['longest_unrecovered']} s (bound {f['recovery_bound']:g} s)",
                ),
                ("schedule ticks", f"{f['ticks']} ({f['first_tick']} to {f['last_tick']})"),
                *[
                    (f"queue {p.queue} (limit {p.limit})", f"peak {p.peak} over {p.leases} leases")
                    for p in report.peaks
                ],
                ("journal rows", f["journal_rows"]),
                ("claims with a signal record", f"{f['claims_recorded']} of {f['claims']}"),
            ],
        ),
        "",
        "By work type:",
        "",
        *_table(
            ("work type", "statuses"),
            [(t, _statuses(s)) for t, s in f["by_type"].items()],
        ),
        "",
    ]
    if f["log_errors"]:
        out += ["The commonest errors in the processes' logs (ids and numbers blanked):", ""]
        out += [f"- {n} x `{text}`" for n, text in f["log_errors"]]
        out.append("")
    if report.unclean_stops:
        out += ["Stops after the faults that did not end with exit 0:", ""]
        out += [f"- {s}" for s in report.unclean_stops]
        out.append("")
    if report.exits:
        out += ["Exits the injector did not cause:", ""]
        out += [f"- `{e}`" for e in report.exits[:20]]
        out.append("")
    for name, title in PROPERTIES.items():
        if report.violations[name]:
            out += [f'Violations of "{title}":', ""]
            out += [f"- {v}" for v in report.violations[name][:20]]
            out.append("")
    out += LIMITS_OF_THE_PROOF
    return "\n".join(out) + "\n"


def _statuses(statuses: dict[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))


LIMITS_OF_THE_PROOF = [
    "## What this proves, and what it does not",
    "",
    "It proves that in this run, under these faults, no history the checker can see broke "
    "a property: every completion came from the last lease, no atomic effect ran twice, "
    "every item ended, no lease outlived its cap or came back after it ran out, the limited "
    "queue never had more in progress than its limit, each tick had one item and no "
    "dependent started early. The checker's own tests show each of these checks fails on "
    "a history that breaks it.",
    "",
    "The recovery bound is a time: an expired lease may wait up to "
    "`RECOVERY_BOUND` seconds for the sweep before the check fails, to leave room "
    "for a restarting database or a killed sweep, so a recovery that is late by less than "
    "that is not caught.",
    "",
    "It does not prove the properties hold in every run: the faults are random and the "
    "interleavings this machine produced are a sample. It runs one PostgreSQL "
    "version on one host: no network partition, replica, failover or disk fault (the HA "
    "tests, `make test-ha`, cover failover, partitions and a pooler on their own), and no "
    "SQLite. Clock skew is of the processes' wall clocks only (leasing reads every lease "
    "time from the database, so this shows the processes' clocks do not matter; a skewed "
    "database clock is not tried). The signal records are incomplete by design (a process "
    "killed after a commit loses its record), so they add checks but are not the ground "
    "truth; the journal is, and it is written by a trigger the production schema does not "
    "have. Effects are rows in the same database (`atomic=True`); an effect outside the "
    "database, with `run_once` without `atomic`, can still run twice if a process dies "
    "between the effect and the key's record, as the README says. Effects committed after "
    "their lease ended are counted, not failed: `run_once` fences the claim of a key, and "
    "the key (not the lease) keeps the effect to once.",
]
