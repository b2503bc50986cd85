"""Reading PostgreSQL's EXPLAIN (FORMAT JSON) plans in tests."""

from __future__ import annotations


def plan_nodes(plan: dict) -> list[dict]:
    """Every node of a plan, depth first."""
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += plan_nodes(child)
    return nodes


def work_item_scans(plan: dict) -> list[dict]:
    """The plan's scans of `work_items` (not of the small tables a claim also reads)."""
    return [
        n
        for n in plan_nodes(plan)
        if "Scan" in n["Node Type"] and n.get("Relation Name") == "work_items"
    ]
