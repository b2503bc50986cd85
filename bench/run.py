"""The benchmark suite of the leasing app: `make bench`.

    .venv/bin/python -m bench.run                       # the full run
    .venv/bin/python -m bench.run --quick               # a smoke run (a few minutes)
    .venv/bin/python -m bench.run --only throughput,ceiling --workers 1,4 --items 50000

It (re)creates its own PostgreSQL database (`--database`, default
`leasing_bench`) on the server of `--database-url` (default: $DATABASE_URL or
postgres://postgres@127.0.0.1:5432/test), migrates it, runs each scenario and
prints one JSON line per scenario on stdout (every line that starts with `{`),
then a readable table. Progress goes to stderr. Subprocesses log to a
temporary directory, kept (and named) when something fails. The database is
dropped at the end unless `--keep`; subprocesses are stopped on exit, failure
and SIGINT/SIGTERM.

Each scenario is a module of `bench.scenarios` (see BENCHMARKS.md for what
each one measures); this module only parses the command line, runs them in
order and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import DEFAULT_SERVER_URL, install_cleanup
from bench.context import Bench
from bench.report import Row, format_table
from bench.scenarios import DEFAULT_SCENARIOS, MACHINE, MODULES, SCENARIOS

__all__ = ["DEFAULT_SCENARIOS", "SCENARIOS", "main"]


def table(results: dict[str, dict[str, Any]]) -> str:
    rows: list[Row] = []
    if results.get("machine") and "error" not in results["machine"]:
        rows += MACHINE.rows(results["machine"])
    for name in SCENARIOS:
        record = results.get(name)
        if record is None:
            continue
        if "error" in record:
            error = " | ".join(line for line in record["error"].splitlines() if line.strip())
            rows.append(Row(name, f"ERROR {error}", "", False))
            continue
        rows += MODULES[name].rows(record)
    return format_table(rows, MACHINE.raw_loop(results))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--items", type=_positive_int, help="M, items per drain (default 20000)")
    parser.add_argument("--workers", type=_int_list, help="worker process counts (default 1,2,4,8)")
    parser.add_argument("--quick", action="store_true", help="a smoke run with small sizes")
    parser.add_argument("--only", type=_scenario_list, help="comma-separated scenarios")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL,
        help="the PostgreSQL server to use (its database part is ignored)",
    )
    parser.add_argument(
        "--database", default="leasing_bench", help="database to (re)create (leasing_bench)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--json-out", type=Path, help="also write the JSON lines to this file")
    parser.add_argument(
        "--sweep-timeout",
        type=float,
        default=180.0,
        help="seconds a sweep pass may take before it is stopped (180)",
    )
    args = parser.parse_args(argv)
    if not args.database_url.startswith(("postgres://", "postgresql://", "pgsql://")):
        parser.error(f"the benchmarks need PostgreSQL, not {args.database_url!r}")
    return args


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected e.g. 1,2,4,8, got {text!r}") from None
    if not values or any(v <= 0 or v > 32 for v in values):
        raise argparse.ArgumentTypeError(f"worker counts must be 1..32, got {text!r}")
    return values


def _scenario_list(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    install_cleanup(bench.teardown)
    started = time.perf_counter()
    wanted = args.only or list(DEFAULT_SCENARIOS)
    try:
        bench.setup()
        bench.run_scenario("machine", MACHINE.run)
        for name in SCENARIOS:
            if name in wanted:
                bench.run_scenario(name, MODULES[name].run)
    finally:
        bench.teardown()
    elapsed = time.perf_counter() - started
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(
            "".join(json.dumps(r, default=str) + "\n" for r in bench.results.values())
        )
    print()
    print(table(bench.results))
    print(f"\n{len(bench.results) - 1} scenario(s) in {elapsed:.0f} s; logs in {bench.log_dir}")
    if bench.failed:
        print(f"FAILED: {', '.join(bench.failed)}", file=sys.stderr)
        return 1
    shutil.rmtree(bench.log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
