"""What a fault run did and what the checker found, as figures and as text.

`summarize()` counts what the evidence shows (items, claims, completions,
renewals, recoveries, effects, records) beside what the injector and the
supervisor did; `Report.text` is the console report and `Report.markdown`
the document (`tests.faults.document`).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.ha.helpers import query

from .checker import PROPERTIES, Evidence, Peak, Rules
from .lease_times import SECOND, unrecovered_expiries
from .records import Violation

# Violations shown per property in the report (all are counted).
SHOWN = 10


@dataclass
class Report:
    passed: bool
    figures: dict[str, Any]
    violations: dict[str, list[Violation]]
    peaks: list[Peak]
    faults: dict[str, int]
    fault_effects: dict[str, int]
    exits: list[str] = field(default_factory=list)  # exits the injector did not cause
    # Stops after the faults that hung or failed (a worker, sweep or scheduler on SIGTERM).
    unclean_stops: list[str] = field(default_factory=list)
    text: str = ""
    markdown: str = ""


def _late_effects(evidence: Evidence) -> int:
    """Effects that committed after their lease had ended (no violation: still once)."""
    ended = {(c.item, c.old_token): c.at for c in evidence.changes if c.is_end}
    return sum(
        1
        for e in evidence.effects
        if (e.item, e.token) in ended and e.at > ended[(e.item, e.token)]
    )


ERROR_LINE = re.compile(r"^(?:\S+\.)?\w+(?:Error|Exception): |^\S+ \S+ ERROR ")
# Item ids, process ids (host:pid:random) and numbers.
NUMBERS = re.compile(r"\b[0-9A-Z]{26}\b|\b[\w.-]+:\d+:[0-9a-f]+\b|\d+(?:[.:]\d+)*")


def log_errors(directory: Path, most: int = 8) -> list[tuple[int, str]]:
    """The commonest error lines of the processes' logs (ids and numbers blanked)."""
    counts: Counter[str] = Counter()
    for path in directory.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if ERROR_LINE.search(line):
                text = line.split(" ERROR ", 1)[-1]
                counts[NUMBERS.sub("N", text)[:160]] += 1
    return [(n, text) for text, n in counts.most_common(most)]


def figures_of(evidence: Evidence, dsn: str) -> dict[str, Any]:
    changes = evidence.changes
    items = evidence.items.values()
    records = Counter(r.kind for r in evidence.records)
    expiries = [r for r in evidence.records if r.kind == "expire"]
    claims = [c for c in changes if c.is_claim]
    claim_records = {(r.item, r.token) for r in evidence.records if r.kind == "claim"}
    superseded = query(
        dsn, "SELECT count(*) FROM work_items WHERE error_message LIKE 'Superseded by%%'"
    )[0][0]
    by_type: dict[str, Counter[str]] = {}
    for item in items:
        by_type.setdefault(item.work_type, Counter())[item.status] += 1
    ticks = sorted({i.tick for i in items if i.tick})
    return {
        "items": len(evidence.items),
        "statuses": dict(Counter(i.status for i in items)),
        "by_type": {t: dict(c) for t, c in sorted(by_type.items())},
        "claims": len(claims),
        "reclaimed_items": len({c.item for c in claims if (c.new_token or 0) > 1}),
        "completions": sum(1 for c in changes if c.is_completion),
        "renewals": sum(1 for c in changes if c.is_renewal),
        "back_to_pending": sum(1 for c in changes if c.is_end and c.new_status == "pending"),
        "ended_failed": sum(1 for c in changes if c.is_end and c.new_status == "failed"),
        "superseded": int(superseded),
        "sweep_recoveries": len(expiries),
        "effects": len(evidence.effects),
        "effect_keys": len({e.key for e in evidence.effects}),
        "late_effects": _late_effects(evidence),
        "records": dict(records),
        "claims_recorded": len(claim_records & {(c.item, c.new_token) for c in claims}),
        "journal_rows": len(changes),
        "longest_unrecovered": round(
            unrecovered_expiries(changes, 0, evidence.observed_at)[1] / SECOND, 1
        ),
        "dependency_edges": len(evidence.edges),
        "ticks": len(ticks),
        "first_tick": ticks[0] if ticks else None,
        "last_tick": ticks[-1] if ticks else None,
    }


def summarize(
    evidence: Evidence,
    found: dict[str, list[Violation]],
    peaks: list[Peak],
    rules: Rules,
    context: dict[str, Any],
) -> Report:
    from .document import markdown

    injector = context["injector"]
    supervisor = context["supervisor"]
    config = context["config"]
    figures = figures_of(evidence, context["dsn"])
    crashes = supervisor.crashes()
    figures.update(
        seconds=config.seconds,
        settle_limit=config.settle,
        seed=config.seed,
        settled=context["settled"],
        settle_seconds=round(context["settle_seconds"], 1),
        wall_seconds=round(context["wall_seconds"], 1),
        finished_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        process_starts={r.name: r.starts for r in supervisor.roles},
        clean_stops=sum(1 for s in supervisor.stops if s.judged and s.clean),
        killed_exits=sum(1 for e in supervisor.exits if e.killed),
        crashes=len(crashes),
        skew=config.skew,
        concurrency=config.concurrency,
        queue_limits=dict(rules.queue_limits),
        recovery_bound=rules.recovery_bound,
        log_errors=log_errors(context["logs"]),
        caps=dict(rules.caps),
    )
    exits = [
        f"{e.role} exited {e.code}{' (a crash)' if e.crash else ''}: {e.last_line[:200]}"
        for e in supervisor.unexpected_exits()
    ]
    unclean = [str(s) for s in supervisor.unclean_stops()]
    report = Report(
        passed=not any(found.values()) and not unclean and not crashes,
        figures=figures,
        violations=found,
        peaks=peaks,
        faults=dict(injector.counts),
        fault_effects=dict(injector.effects),
        exits=exits,
        unclean_stops=unclean,
    )
    report.text = text(report)
    report.markdown = markdown(report)
    return report


def text(report: Report) -> str:
    f = report.figures
    lines = [
        f"FAULT RUN {'PASSED' if report.passed else 'FAILED'}: {f['seconds']:g} s of faults "
        f"(seed {f['seed']}), settled in {f['settle_seconds']} s"
        f"{'' if f['settled'] else ' (NOT settled: items left unfinished)'}, "
        f"{f['wall_seconds']} s in all",
        "faults injected: "
        + ", ".join(f"{k} {v}" for k, v in sorted(report.faults.items()))
        + f" ({sum(report.faults.values())} in all)",
        "what they did: " + ", ".join(f"{k} {v}" for k, v in sorted(report.fault_effects.items())),
        f"process starts: {sum(f['process_starts'].values())} "
        f"({f['killed_exits']} after SIGKILL, {len(report.exits)} exits by themselves, "
        f"{f['crashes']} of them crashes); "
        f"stopped at the end: {f['clean_stops']} cleanly, {len(report.unclean_stops)} not",
        f"items: {f['items']} {f['statuses']} ({f['superseded']} superseded)",
        f"claims {f['claims']} ({f['reclaimed_items']} items claimed more than once), "
        f"completions {f['completions']}, renewals {f['renewals']}, "
        f"back to pending {f['back_to_pending']}, ended failed {f['ended_failed']}, "
        f"sweep recoveries recorded {f['sweep_recoveries']}",
        f"effects {f['effects']} ({f['effect_keys']} keys; {f['late_effects']} committed after "
        f"their lease ended), journal rows {f['journal_rows']}, signal records {f['records']} "
        f"(claims recorded: {f['claims_recorded']} of {f['claims']})",
        f"schedule ticks: {f['ticks']} ({f['first_tick']} .. {f['last_tick']}); longest an "
        f"expired lease waited for the sweep: {f['longest_unrecovered']} s",
        "limits: "
        + ", ".join(
            f"queue {p.queue} limit {p.limit}: peak {p.peak} over {p.leases} leases"
            for p in report.peaks
        ),
        "violations:",
    ]
    for name, title in PROPERTIES.items():
        found = report.violations[name]
        lines.append(f"  {name:<18} {len(found):>5}  {title}")
        lines += [f"      {v}" for v in found[:SHOWN]]
    if f["log_errors"]:
        lines.append("commonest errors in the processes' logs:")
        lines += [f"  {n:>6} x {text}" for n, text in f["log_errors"]]
    if report.unclean_stops:
        lines.append("stops after the faults that did not end with exit 0:")
        lines += [f"  {s}" for s in report.unclean_stops]
    if report.exits:
        lines.append("exits the injector did not cause:")
        lines += [f"  {e}" for e in report.exits[:SHOWN]]
    return "\n".join(lines)
