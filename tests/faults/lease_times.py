"""The checks on lease times: renewals within the cap, expired leases recovered.

Part of the fault run's checker (`tests.faults.checker`); pure functions of
the run's records, like the other checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .records import IN_PROGRESS, Change, Record, Violation

SECOND = 1_000_000  # microseconds
# A claim computes its expiry and its deadline from one statement_timestamp(),
# so a deadline is exactly acquired + cap; this only absorbs float rounding.
CAP_TOLERANCE = 1_000


def as_seconds(microseconds: int) -> str:
    return f"{microseconds / SECOND:.6f}"


def claims_by_lease(changes: Iterable[Change]) -> dict[tuple[str, int], Change]:
    """The claim that granted each (item, token)."""
    return {(c.item, c.new_token): c for c in changes if c.is_claim and c.new_token is not None}


# --- no lease renewed past its cap ----------------------------------------------------------


def renewals_past_cap(
    changes: Iterable[Change],
    records: Iterable[Record],
    caps: Mapping[str, float],
    default_cap: float,
) -> list[Violation]:
    """No expiry past its lease's deadline, no deadline past the type's cap, and no
    renewal of a lease that had already run out (a late renewal never resurrects one).

    `caps` maps a work type to its cap in seconds (its handler's `timeout` or
    `max_lease_lifetime`); other types have `default_cap` (MAX_LEASE_LIFETIME).
    """
    changes = list(changes)
    found: list[Violation] = []
    granted = claims_by_lease(changes)

    def flag(item: str, detail: str) -> None:
        found.append(Violation("renewal_past_cap", item, detail))

    for c in changes:
        if c.new_status != IN_PROGRESS:
            continue
        if c.new_expires is not None and c.deadline is not None and c.new_expires > c.deadline:
            flag(
                c.item,
                f"token {c.new_token}: expiry {as_seconds(c.new_expires)} is past its deadline "
                f"{as_seconds(c.deadline)}",
            )
        if c.is_claim and c.deadline is not None and c.acquired is not None:
            cap = round(caps.get(c.work_type, default_cap) * SECOND)
            if c.deadline - c.acquired > cap + CAP_TOLERANCE:
                flag(
                    c.item,
                    f"token {c.new_token}: deadline {as_seconds(c.deadline - c.acquired)} s after "
                    f"the claim, the cap of {c.work_type} is {as_seconds(cap)} s",
                )
        if c.is_renewal:
            claim = granted.get((c.item, c.new_token or 0))
            if c.old_expires is not None and c.old_expires <= c.stmt:
                flag(
                    c.item,
                    f"token {c.new_token}: renewed at {as_seconds(c.stmt)}, after it expired at "
                    f"{as_seconds(c.old_expires)}",
                )
            if claim is not None and claim.deadline != c.deadline:
                flag(c.item, f"token {c.new_token}: a renewal moved its deadline")
    for record in records:
        if record.kind != "renew" or record.expires is None:
            continue
        claim = granted.get((record.item, record.token))
        if claim is not None and claim.deadline is not None and record.expires > claim.deadline:
            flag(
                record.item,
                f"{record.worker} was told token {record.token} was renewed to "
                f"{as_seconds(record.expires)}, past its deadline {as_seconds(claim.deadline)}",
            )
    return found


# --- expired leases recovered ------------------------------------------------------------


def unrecovered_expiries(
    changes: Iterable[Change], bound: float, observed_at: int | None = None
) -> tuple[list[Violation], int]:
    """No lease stays in progress past its expiry for more than `bound` seconds.

    The sweep passes every second and recovers every expired lease it finds
    (semantics: "every expired lease is recovered by the next sweep pass");
    the bound leaves room for the faults (a restarting database, a killed
    sweep). A lease still in progress when the evidence was read
    (`observed_at`) counts until then. Returns the violations and the longest
    wait seen (microseconds).
    """
    found: list[Violation] = []
    live: dict[str, tuple[int | None, int | None]] = {}
    longest = 0
    limit = round(bound * SECOND)

    def waited(item: str, token: int | None, expires: int, until: int, what: str) -> None:
        nonlocal longest
        late = until - expires
        longest = max(longest, late)
        if late > limit:
            found.append(
                Violation(
                    "unrecovered_expiry",
                    item,
                    f"token {token} expired at {as_seconds(expires)} and stayed in progress "
                    f"{late / SECOND:.1f} s, {what}",
                )
            )

    for c in sorted(changes, key=lambda c: (c.at, c.seq)):
        if c.new_status == IN_PROGRESS:
            live[c.item] = (c.new_token, c.new_expires)
        elif c.is_end:
            token, expires = live.pop(c.item, (None, None))
            if expires is not None:
                until = f"until it went {c.new_status} at {as_seconds(c.stmt)}"
                waited(c.item, token, expires, c.stmt, until)
    if observed_at is not None:
        for item, (token, expires) in sorted(live.items()):
            if expires is not None:
                waited(item, token, expires, observed_at, "and still was at the end of the run")
    return found, longest
