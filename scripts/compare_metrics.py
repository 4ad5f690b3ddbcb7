#!/usr/bin/env python
"""Compare the metrics of two runs, value by value, leaving out what the wall clock decides.

    scripts/compare_metrics.py BEFORE AFTER

BEFORE and AFTER are two ``metrics.jsonl`` files, or two directories: then every ``metrics.jsonl``
under BEFORE is compared with the file at the same relative path under AFTER. A refactoring that
must not change what a run computes shows here as "every value matched"; any row, key or value
that differs (floats compared exactly, to the last digit) is printed and the exit status is 1.

Left out: timing_s/*, perf/* (throughput, MFU: tokens over seconds), async/* (how busy the
background thread was), memory/*, reward/time_s, and any key named in --ignore.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

WALL_CLOCK = ("timing_s/", "perf/", "async/", "memory/", "reward/time_s")


def read_rows(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}:{number}: not a JSON line ({exc.msg})") from None
    return rows


def pairs(before: Path, after: Path) -> list[tuple[str, Path, Path]]:
    """The (label, before file, after file) to compare."""
    if before.is_file() and after.is_file():
        return [(before.name, before, after)]
    if before.is_dir() and after.is_dir():
        found = sorted(before.rglob("metrics.jsonl"))
        if not found:
            raise SystemExit(f"{before}: no metrics.jsonl under it")
        return [(str(p.relative_to(before)), p, after / p.relative_to(before)) for p in found]
    raise SystemExit(f"expected two metrics.jsonl files or two directories, got {before} and {after}")


def compare_rows(
    label: str, old: list[dict], new: list[dict], ignored: tuple[str, ...]
) -> tuple[int, int, list[str]]:
    """(rows matched, values matched, differences) between two files' rows."""
    problems = []
    if len(old) != len(new):
        problems.append(f"{label}: {len(old)} rows before, {len(new)} after")
    rows_matched = values_matched = 0
    for index, (a, b) in enumerate(zip(old, new)):
        keep = lambda row: {k: v for k, v in row.items() if not k.startswith(ignored)}  # noqa: E731
        a, b = keep(a), keep(b)
        where = f"{label} row {index + 1} (step {a.get('step')})"
        row_ok = True
        for key in sorted(set(a) | set(b)):
            if key not in b:
                problems.append(f"{where}: {key} only before ({a[key]!r})")
            elif key not in a:
                problems.append(f"{where}: {key} only after ({b[key]!r})")
            elif a[key] != b[key] or type(a[key]) is not type(b[key]):
                problems.append(f"{where}: {key} {a[key]!r} before, {b[key]!r} after")
            else:
                values_matched += 1
                continue
            row_ok = False
        rows_matched += row_ok
    return rows_matched, values_matched, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="PREFIX",
        help="also leave out keys starting with PREFIX (repeatable)",
    )
    args = parser.parse_args(argv)
    ignored = WALL_CLOCK + tuple(args.ignore)
    total_rows = total_values = rows_matched = values_matched = 0
    problems: list[str] = []
    for label, old_path, new_path in pairs(args.before, args.after):
        if not new_path.is_file():
            problems.append(f"{label}: missing after ({new_path})")
            continue
        old, new = read_rows(old_path), read_rows(new_path)
        rows, values, found = compare_rows(label, old, new, ignored)
        total_rows += max(len(old), len(new))
        total_values += sum(1 for row in old for k in row if not k.startswith(ignored))
        rows_matched, values_matched = rows_matched + rows, values_matched + values
        problems += found
        print(f"{label}: {rows}/{max(len(old), len(new))} rows, {values} values matched")
    for problem in problems:
        print(problem)
    print(
        f"total: {rows_matched}/{total_rows} rows and {values_matched}/{total_values} values matched "
        f"(ignoring {', '.join(ignored)})"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
