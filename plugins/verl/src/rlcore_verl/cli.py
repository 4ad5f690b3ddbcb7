"""``rlcore from-verl``: a verl command line, launch script or YAML config in, a manifest out.

    rlcore from-verl examples/run_qwen2-7b_seq_balance.sh > m.toml
    rlcore from-verl algorithm.adv_estimator=grpo data.train_files=train.parquet ... --out m.toml
    rlcore from-verl --config my_verl.yaml trainer.total_epochs=3
    rlcore from-verl --out m.toml -- python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo ...

The manifest goes to ``--out`` (or stdout), every line commented with the verl keys it came from;
the keys that could not be mapped are listed on stderr with the reason. Exit status: 0 when
everything essential mapped, 1 when something essential did not (the manifest is still written,
listing it), 2 for unreadable input.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

from rlcore.errors import UsageError

EPILOG = """\
A SOURCE is a launch script (its python3 -m verl.trainer.main_ppo command, with the script's
variables; the words after the script are its arguments, "$@"), a verl YAML config (.yaml), or a
KEY=VALUE override as typed after main_ppo (+KEY=VALUE, ~KEY too). They apply in this order: the
YAML configs, the script's command, the overrides given here. To paste a whole command, put it
after "--".
"""

_PASTED = re.compile(r"^(python[\d.]*|-m|-u|.*(?:^|\.)main_(?:ppo|dapo)(?:\.py)?)$")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = "Write an rlcore manifest from a verl command line, launch script or YAML config."
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "sources", nargs="*", metavar="SOURCE", help="a script (or - for stdin), a .yaml config, or KEY=VALUE"
    )
    parser.add_argument(
        "--config", action="append", default=[], metavar="FILE", help="a verl YAML config (repeatable)"
    )
    parser.add_argument("--out", "-o", metavar="FILE", help="write the manifest here (default: stdout)")
    parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    parser.add_argument(
        "--launcher",
        choices=("auto", "local", "ray", "slurm"),
        default="auto",
        help="where the run goes: auto = ray for several GPUs (as verl), local for one; slurm = the slurm launcher",
    )


def run(args: argparse.Namespace) -> int:
    from rlcore_verl.convert import Inputs, convert_inputs, report

    out = Path(args.out) if args.out else None
    if out is not None and out.exists() and not args.force:
        raise UsageError(f"--out {out} exists; give --force to overwrite it")
    inputs = Inputs(configs=[Path(p) for p in args.config])
    before_script: list[str] = []
    words = list(args.sources)
    while words:
        word = words.pop(0)
        if word == "-" and inputs.script is None:
            inputs.script, inputs.script_text, inputs.script_args = "<stdin>", sys.stdin.read(), words
            break
        if _is_override(word):
            before_script.append(word)
        elif word.endswith((".yaml", ".yml")):
            inputs.configs.append(Path(word))
        elif _PASTED.match(word):
            if word.endswith(("main_dapo", "main_dapo.py")):
                inputs.module = "recipe.dapo.main_dapo"
        elif Path(word).is_file():
            inputs.script, inputs.script_args = word, words
            break
        else:
            raise UsageError(f"{word!r} is not a file, a .yaml config or a KEY=VALUE override")
    inputs.overrides = before_script
    result = convert_inputs(inputs, out_dir=(out.parent if out is not None else None), launcher=args.launcher)
    if out is None:
        sys.stdout.write(result.text)
        sys.stdout.flush()
    else:
        _write_atomically(out, result.text)
    report(result, out, sys.stderr)
    return 1 if result.failed else 0


def _is_override(word: str) -> bool:
    return word.startswith(("+", "~")) or ("=" in word and not word.startswith("-"))


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
