"""``rlcore data``: prepare datasets.

    rlcore data gsm8k --input gsm8k/train.jsonl --output data/gsm8k
    rlcore data gsm8k --input hub --output data/gsm8k
    rlcore data gsm8k --input gsm8k/ --style verl --output data/gsm8k      # verl's own wording, row for row
    rlcore data gsm8k --input hub --style dapo --output data/gsm8k_dapo    # "Answer: N" for math_dapo
    rlcore data math --input MATH/ --output data/math                      # the published layout, or jsonl/parquet
    rlcore data synthetic --task addition --size 1000 --seed 1 --output data/add/train.parquet
    rlcore data synthetic --task addition --split test --size 64 --param digits=2 --output data/add/test.parquet
"""

from __future__ import annotations

import argparse
from functools import partial

from rlcore.errors import RlcoreError, UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="{gsm8k,math,synthetic}")
    sub.required = True
    g = sub.add_parser("gsm8k", help="convert GSM8K (question/answer '#### N') into verl-format parquet")
    g.add_argument("--input", required=True, help="a jsonl/parquet file, a directory of them, or 'hub'")
    g.add_argument("--output", required=True, help="directory for <split>.parquet")
    g.add_argument("--style", choices=["rlcore", "verl", "dapo"], default="rlcore",
                   help="the prompt's wording: rlcore's, verl's preprocessing (the same rows a verl recipe trains on), "
                   "or dapo (a last line 'Answer: N', for the math_dapo reward)")
    m = sub.add_parser("math", help="convert MATH (problem/solution with \\boxed{} answers) into verl-format parquet")
    m.add_argument("--input", required=True, help="MATH's directory (<split>/<subject>/<n>.json), or jsonl/parquet files")
    m.add_argument("--output", required=True, help="directory for <split>.parquet")
    s = sub.add_parser("synthetic", help="write a synthetic task with checkable answers as parquet")
    s.add_argument("--task", required=True, help="the task: addition or arithmetic")
    s.add_argument("--size", type=int, default=1000, help="number of rows")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--split", choices=["train", "test"], default="train", help="train and test never overlap")
    s.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE", help="a task parameter, e.g. digits=2 (repeatable)"
    )
    s.add_argument("--output", required=True, help="the .parquet file to write")


def run(args: argparse.Namespace) -> int:
    if args.data_command in ("gsm8k", "math"):
        if args.data_command == "gsm8k":
            from rlcore.data.gsm8k import convert as convert_gsm8k

            convert = partial(convert_gsm8k, style=args.style)
        else:
            from rlcore.data.math import convert
        try:
            written = convert(args.input, args.output)
        except RlcoreError as exc:  # what is wrong is the input: a usage error (exit 2)
            raise UsageError(str(exc)) from None
        for split, path in written.items():
            print(f"{split}: {path}")
        return 0
    from rlcore.data.synthetic import write_synthetic

    params: dict[str, str] = {}
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--param expects KEY=VALUE, got {item!r}")
        params[key.strip()] = value.strip()
    params.update(size=args.size, seed=args.seed, split=args.split)
    path = write_synthetic(args.task, args.output, **params)
    print(f"{args.task} ({args.split}, {args.size} rows): {path}")
    return 0
