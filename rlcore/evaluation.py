"""``rlcore eval MANIFEST``: score a trained policy on validation sets, as the run's own validation
does (same engine, agent loop, reward, sampling and seeds), and write a JSON report.

The policy comes from a checkpoint (``--checkpoint``: a ``step_N`` directory, or a run directory
for its newest intact one) or from an exported Hugging Face directory (``--model``). Imports
nothing heavy at module level (the CLI imports this module to build its parser).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rlcore.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "manifest", help="the run's TOML manifest (its engine, agent loop, reward and [data] val)"
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--checkpoint",
        type=Path,
        help="a checkpoint directory (step_N), or a run directory for its newest intact checkpoint",
    )
    source.add_argument(
        "--model", type=Path, help="an exported Hugging Face model directory (rlcore's export, or any)"
    )
    parser.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="[NAME=]SPEC",
        help="an evaluation set (a file or synthetic:<task>), repeatable; default: [data] val",
    )
    parser.add_argument(
        "--samples",
        type=int,
        default=None,
        metavar="K",
        help="samples per prompt; pass@K is reported (default: [rollout] val_samples_per_prompt)",
    )
    parser.add_argument(
        "--max-prompts", type=int, default=None, metavar="N", help="evaluate on at most N prompts of each set"
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="the JSON report (default: RUN_DIR/eval/step_N.json for a checkpoint RUN_DIR/checkpoints/step_N, "
        "./eval.json for --model or the manifest's own model)",
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="TABLE.KEY=VALUE")
    harness = parser.add_argument_group("an outside evaluation harness (e.g. lm_eval, from rlcore-lm-eval)")
    harness.add_argument(
        "--harness",
        default=None,
        metavar="NAME",
        help="hand the policy (the run's engine and actor) to this harness too; its report is kept beside rlcore's",
    )
    harness.add_argument("--tasks", default=None, metavar="A,B", help="the harness's tasks, comma-separated")
    harness.add_argument(
        "--harness-option",
        dest="harness_options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one of the harness's options (a TOML value), repeatable: --harness-option num_fewshot=5",
    )


def _named_sets(specs: list[str], default: Any, required: bool = True) -> dict[str, Any]:
    if not specs:
        if default is None and not required:
            return {}
        if default is None:
            raise UsageError(
                "nothing to evaluate on: the manifest has no [data] val; name a set with --data SPEC"
            )
        return {"val": default}
    sets: dict[str, str] = {}
    for spec in specs:
        name, sep, rest = spec.partition("=")
        if sep and name and ":" not in name and "/" not in name:
            sets[name] = rest
        else:
            sets[Path(spec.split("?")[0]).stem or spec] = spec
    return sets


def _checkpoint(path: Path) -> Path:
    from rlcore.checkpoint import Checkpointer, verify_checkpoint

    if not path.exists():
        raise UsageError(f"--checkpoint {path}: no such directory")
    if (path / "checkpoints").is_dir():  # a run directory: its newest intact checkpoint
        found = Checkpointer(path).latest()
        if found is None:
            raise UsageError(f"--checkpoint {path}: the run directory holds no complete checkpoint")
        return found
    problem = verify_checkpoint(path)
    if problem is not None:
        raise UsageError(f"--checkpoint {path}: {problem}")
    return path


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Build the run's eval roles around the chosen weights (no optimizer, critic, reference,
    training data or sinks) and validate on each set; the report."""
    from rlcore.data import load_prompts
    from rlcore.errors import RlcoreError
    from rlcore.manifest.loader import load_manifest
    from rlcore.registry import Registry
    from rlcore.trainer.roles import build_roles
    from rlcore.trainer.validation import validate

    overrides = list(args.overrides)
    if args.samples is not None:
        if args.samples < 1:
            raise UsageError(f"--samples must be at least 1, got {args.samples}")
        overrides.append(f"rollout.val_samples_per_prompt={args.samples}")
    if args.max_prompts is not None and args.max_prompts < 1:
        raise UsageError(f"--max-prompts must be at least 1, got {args.max_prompts}")
    registry = Registry.discover()
    manifest = load_manifest(args.manifest, overrides, registry=registry)
    harness = _harness(args, registry) if getattr(args, "harness", None) else None
    checkpoint = _checkpoint(args.checkpoint) if args.checkpoint else None
    if args.model is not None:
        if not (args.model / "config.json").is_file():
            raise UsageError(f"--model {args.model}: not a Hugging Face model directory (no config.json)")
        model = manifest.core.model
        model.path, model.gguf_file, model.lora = str(args.model.resolve()), None, None  # an export is merged
    sets = _named_sets(args.data, manifest.core.data.val, required=harness is None)
    roles = build_roles(manifest, "eval", checkpoint=checkpoint)
    try:
        d = manifest.core.data
        results: dict[str, dict[str, float]] = {}
        for name, spec in sets.items():
            try:
                prompts = load_prompts(
                    spec,
                    role="val",
                    tokenizer=roles.tokenizer,
                    max_prompt_tokens=d.max_prompt_tokens,
                    prompt_key=d.prompt_key,
                    base_dir=manifest.base_dir,
                    limit=args.max_prompts or d.val_max_prompts,
                    chat_template_kwargs=d.chat_template_kwargs,
                    context=roles.context,
                )
                roles.scorer.check_data(prompts.prompts, prompts.source)
            except RlcoreError as exc:  # bad input data: a usage error, like a bad manifest
                raise UsageError(str(exc)) from None
            metrics = validate(roles, prompts.prompts, roles.start_step)
            metrics["prompts"] = float(len(prompts.prompts))
            results[name] = metrics
        harness_report = None
        if harness is not None:
            from rlcore.eval_policy import TrainerPolicy

            component, instance = harness
            directory = Path(tempfile.mkdtemp(prefix=f"rlcore-{component.name}-"))  # moved beside the report
            harness_report = {
                "name": component.name,
                "provider": component.provider,
                "output_dir": str(directory),
                **instance.run(TrainerPolicy(roles), str(directory)),
            }
    finally:
        for close in roles.closers():
            close()
    report = {
        "manifest": str(Path(args.manifest).resolve()),
        "policy": str(checkpoint or args.model or manifest.core.model.path),
        "step": roles.start_step,
        "samples_per_prompt": manifest.core.rollout.val_samples_per_prompt,
        "sets": results,
    }
    if harness_report is not None:
        report["harness"] = harness_report
    return report


def _harness(args: argparse.Namespace, registry: Any) -> tuple[Any, Any]:
    """The ``--harness`` component, built with ``--tasks`` and ``--harness-option`` (checked before
    any model loads)."""
    from pydantic import ValidationError

    from rlcore.manifest.loader import parse_value

    component = registry.get("eval_harness", args.harness)
    options: dict[str, Any] = {}
    if args.tasks is not None:
        options["tasks"] = [t.strip() for t in args.tasks.split(",") if t.strip()]
    for item in args.harness_options:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--harness-option expects KEY=VALUE, got {item!r}")
        options[key.strip()] = parse_value(value.strip())
    try:
        validated = component.options.model_validate(options)
    except ValidationError as exc:
        fields = ", ".join(component.options.model_fields)
        problems = "; ".join(
            f"{'--tasks' if e['loc'][:1] == ('tasks',) else '--harness-option ' + '.'.join(str(x) for x in e['loc'])}: "
            + ("unknown option" if e["type"] == "extra_forbidden" else e["msg"])
            for e in exc.errors()
        )
        raise UsageError(f"--harness {args.harness}: {problems} (its options: {fields})") from None
    return component, component.load_factory()(validated, None)


def _print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    k = report["samples_per_prompt"]
    table = Table(title=f"{report['policy']} (step {report['step']})")
    for column in ("set", "data source", "prompts", "mean reward", "pass@1") + (
        (f"pass@{k}",) if k > 1 else ()
    ):
        table.add_column(column, justify="left" if column in ("set", "data source") else "right")
    for name, metrics in report["sets"].items():
        sources = sorted(key[len("val/") : -len("/pass@1")] for key in metrics if key.endswith("/pass@1"))
        for source in sources:
            row = [
                name,
                source,
                f"{metrics['prompts']:.0f}",
                f"{metrics[f'val/{source}/reward/mean']:.4f}",
                f"{metrics[f'val/{source}/pass@1']:.4f}",
            ]
            if k > 1:
                row.append(f"{metrics[f'val/{source}/pass@{k}']:.4f}")
            table.add_row(*row)
    Console(soft_wrap=True).print(table)


def run(args: argparse.Namespace) -> int:
    report = evaluate(args)
    if args.output is not None:
        output = args.output
    elif args.checkpoint is not None:
        output = Path(report["policy"]).parent.parent / "eval" / f"{Path(report['policy']).name}.json"
    else:
        output = Path("eval.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    harness = report.get("harness")
    if harness is not None:  # the harness's own files, beside the report: eval.lm_eval/
        kept = output.with_name(f"{output.stem}.{harness['name']}")
        if kept.exists():
            shutil.rmtree(kept)
        shutil.move(harness["output_dir"], kept)
        harness["output_dir"] = str(kept)
    tmp = output.with_name(output.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    tmp.replace(output)
    if report["sets"]:
        _print_table(report)
    if harness is not None:
        print(f"{harness['name']} ({harness['provider']}):")
        print(harness.get("table", ""))
        print(f"{harness['name']}'s files: {harness['output_dir']}")
    print(f"report: {output}")
    return 0
