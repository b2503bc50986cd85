"""Registering a handler for the length of a test: `override_handler()`."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from ..context import WorkContext
from ..handlers import HandlerSpec, registry

# Every field of a registration but its work type and function: its options.
_OPTIONS = tuple(
    field.name
    for field in dataclasses.fields(HandlerSpec)
    if field.name not in {"work_type", "func"}
)


@contextlib.contextmanager
def override_handler(
    work_type: str, func: Callable[[WorkContext], Any], **options: Any
) -> Iterator[HandlerSpec]:
    """Make `func` the handler of `work_type` (with `@handler`'s options) inside the block.

    Replaces a registered handler (a stub for a slow or external one) or
    registers a type nothing handles; on leaving, the previous registration
    comes back, or the type is unregistered again.
    """
    previous = registry.get(work_type) if work_type in registry else None
    spec = registry.register(work_type, func, replace=True, **options)
    try:
        yield spec
    finally:
        if previous is None:
            registry.unregister(spec.work_type)
        else:
            kept = {name: getattr(previous, name) for name in _OPTIONS}
            registry.register(previous.work_type, previous.func, replace=True, **kept)
