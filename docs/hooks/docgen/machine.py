"""The state machine's tables, from `leasing.transitions` (the one place they are declared).

* Transitions: each one's name, the statuses it leaves and may leave the row
  in, who takes it, whether the lease's token fences it, and its summary.
* Guards: per feature, the statuses it cares about and its rule on every
  transition that touches them.
"""

from __future__ import annotations

from .text import code, escape, table


def _statuses(statuses: tuple[str, ...]) -> str:
    return ", ".join(code(s) for s in statuses)


def render_transitions() -> str:
    from leasing.transitions import TRANSITIONS

    rows = [
        (
            code(t.name),
            _statuses(t.sources),
            _statuses(t.targets),
            escape(t.actor),
            "yes" if t.fenced else "",
            escape(t.summary),
        )
        for t in TRANSITIONS
    ]
    header = ("transition", "from", "to", "taken by", "fenced", "what it is")
    return table(header, rows) + "\n"


def render_guards() -> str:
    from leasing.transitions import GUARDS, TRANSITIONS

    order = [t.name for t in TRANSITIONS]
    parts: list[str] = []
    for guard in GUARDS:
        rows = [(code(name), escape(guard.rules[name])) for name in order if name in guard.rules]
        parts.append(
            f"**{escape(guard.feature.replace('_', ' '))}** "
            f"(statuses it cares about: {_statuses(guard.statuses)})\n\n"
            + table(("transition", "rule"), rows)
            + "\n"
        )
    return "\n".join(parts)
