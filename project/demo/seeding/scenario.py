"""The demo scenario file: reading it, checking its values, and what a seed run created."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError

from leasing.models import WorkItemStatus

DEFAULT_SCENARIO = Path(settings.BASE_DIR) / "fixtures" / "demo.json"
ITEM_STATUSES = tuple(WorkItemStatus.values)


class ScenarioError(CommandError):
    """The scenario file is missing, not JSON, or describes something impossible."""


@dataclass
class Summary:
    """What a seed run created."""

    items: Counter[str] = field(default_factory=Counter)
    checkpoints: Counter[str] = field(default_factory=Counter)
    processes: Counter[str] = field(default_factory=Counter)
    idempotency_keys: int = 0
    operator_actions: int = 0

    def lines(self) -> list[str]:
        def fmt(counter: Counter[str]) -> str:
            return ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) or "none"

        return [
            f"work items: {sum(self.items.values())} ({fmt(self.items)})",
            f"checkpoints: {sum(self.checkpoints.values())} ({fmt(self.checkpoints)})",
            f"workers table: {fmt(self.processes)}",
            f"idempotency keys: {self.idempotency_keys}, operator actions: {self.operator_actions}",
        ]


def load_scenario(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"Scenario file not found: {path}") from None
    try:
        scenario = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(scenario, dict):
        raise ScenarioError(f"{path}: the scenario must be a JSON object.")
    return scenario


def object_list(
    container: dict[str, Any], name: str, where: str = "scenario"
) -> list[dict[str, Any]]:
    value = container.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ScenarioError(f"{where}: {name!r} must be a list of objects.")
    return value


def text(container: dict[str, Any], name: str, where: str) -> str:
    value = container.get(name)
    if not isinstance(value, str) or not value:
        raise ScenarioError(f"{where}: {name!r} must be a non-empty string, got {value!r}.")
    return value
