"""`python -m bench [--quick] [--only NAME ...] [--json PATH]`: run the benchmark scenarios.

Starts an embedded PostgreSQL and Valkey (throwaway, fsync off) unless DATABASE_URL / REDIS_URL
are set, migrates a template database, measures the machine's ceilings, then runs each scenario
on fresh databases cloned from the template. Prints a table and writes JSON results.
"""

from __future__ import annotations

import argparse
import sys

from bench import SCENARIOS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Agent Engine benchmarks: absolute numbers and ratios to same-run baselines.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, under two minutes (make bench)"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SCENARIOS,
        metavar="NAME",
        help=f"run only these scenarios: {', '.join(SCENARIOS)}",
    )
    parser.add_argument(
        "--json",
        dest="json_path",
        metavar="PATH",
        help="where to write the JSON results (default: bench/results/<mode>-<timestamp>.json)",
    )
    parser.add_argument(
        "--no-ceilings", action="store_true", help="skip the PostgreSQL/Dramatiq ceilings"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Heavy imports only once there is work to do: `--help` stays instant.
    from bench.runner import run

    return run(
        quick=args.quick,
        only=tuple(args.only or SCENARIOS),
        json_path=args.json_path,
        ceilings=not args.no_ceilings,
    )


if __name__ == "__main__":
    sys.exit(main())
