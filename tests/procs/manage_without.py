"""`manage.py` with some installed packages made unimportable, as on a site
that never installed them. Usage:

    python -m tests.procs.manage_without django_q,prometheus_client recoverysweep --schedule
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from typing import Any


def main() -> None:
    names = {name for name in sys.argv[1].split(",") if name}
    original = importlib.machinery.PathFinder.find_spec

    def find_spec(fullname: str, path: Any = None, target: Any = None) -> Any:
        # Not found on sys.path: `import` raises ModuleNotFoundError and
        # importlib.util.find_spec() answers None, as for a missing package.
        if fullname.split(".")[0] in names:
            return None
        return original(fullname, path, target)

    importlib.machinery.PathFinder.find_spec = find_spec  # type: ignore[method-assign]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *sys.argv[2:]])


if __name__ == "__main__":
    main()
