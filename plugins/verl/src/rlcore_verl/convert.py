"""Inputs (a script, YAML configs, overrides) -> a manifest's text and the report of what did not map."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from rlcore.errors import UsageError
from rlcore_verl.config import VerlConfig
from rlcore_verl.hydra import parse_override, read_yaml_config
from rlcore_verl.manifest import render
from rlcore_verl.mapping import Conversion, Options, convert
from rlcore_verl.shell import find_verl_command


@dataclass
class Inputs:
    script: str | None = None  # a path, or "<stdin>" with script_text
    script_text: str | None = None
    script_args: list[str] = field(default_factory=list)  # the script's "$@"
    configs: list[Path] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)  # typed on the command line, applied last
    module: str = "verl.trainer.main_ppo"


@dataclass
class Result:
    text: str
    conversion: Conversion
    sources: list[str]
    notes: list[str]

    @property
    def unknown(self) -> dict[str, tuple[str, bool]]:
        return self.conversion.cfg.unknown

    @property
    def failed(self) -> bool:
        """Something essential did not map: an essential key, or a key verl itself would refuse."""
        refused = [k for k, (_, added) in self.unknown.items() if not added]
        return bool(
            refused or self.conversion.cfg.problems or any(u.essential for u in self.conversion.unmapped)
        )


def convert_inputs(
    inputs: Inputs,
    *,
    out_dir: Path | None = None,
    launcher: str = "auto",
    environ: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Result:
    cwd = cwd or Path.cwd()
    sources: list[str] = []
    notes: list[str] = []
    words: list[tuple[str, str]] = []
    module = inputs.module
    ray_job, ray_address = False, None
    if inputs.script is not None:
        text = inputs.script_text
        if text is None:
            try:
                text = Path(inputs.script).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(f"cannot read the script {inputs.script!r}: {exc}") from None
        name = Path(inputs.script).name if inputs.script != "<stdin>" else "<stdin>"
        command = find_verl_command(
            text,
            name=name,
            script_path=inputs.script,
            args=inputs.script_args,
            environ=dict(os.environ) if environ is None else environ,
            cwd=str(cwd),
        )
        module, ray_job, ray_address = command.module, command.ray_job, command.ray_job_address
        words += command.words
        notes += command.notes
        sources.append(inputs.script)
        if inputs.script_args and not any(origin == "command line" for _, origin in command.words):
            extra = [w for w in inputs.script_args if "=" in w or w.startswith(("+", "~"))]
            if extra:
                notes.append(
                    f'{name}: its verl command has no "$@"; the overrides given after the script are '
                    "applied after it"
                )
                words += [(w, "command line") for w in extra]
    words += [(w, "command line") for w in inputs.overrides]
    if inputs.overrides and inputs.script is None:
        sources.append("the command line")
    cfg = VerlConfig(module)
    for path in inputs.configs:
        flat = read_yaml_config(path)
        if "defaults" in flat:
            notes.append(
                f"{path}: its Hydra defaults list is not composed; verl's ppo_trainer.yaml values are the base"
            )
        cfg.apply_yaml(flat, path.name)
        sources.insert(0, str(path))
    for word, origin in words:
        if word.startswith("--") or word == "-m":
            notes.append(f"{origin}: {word}: a Hydra option, not an override; not read")
            continue
        cfg.apply_override(parse_override(word, origin))
    if not sources:
        raise UsageError(
            "nothing to convert: give a verl launch script, a .yaml config or KEY=VALUE overrides"
        )
    options = Options(
        launcher=launcher,
        out_dir=out_dir.resolve() if out_dir is not None else None,
        cwd=cwd,
        ray_job=ray_job,
        ray_job_address=ray_address,
    )
    conversion = convert(cfg, options)
    return Result(render(conversion, sources), conversion, sources, notes)


def report(result: Result, out: Path | None, stream: TextIO) -> None:
    """What was read, what went where, and every key that did not map, with why."""
    conversion, cfg = result.conversion, result.conversion.cfg
    given = cfg.given_keys()
    mapped = {s for line in conversion.lines for s in line.sources if cfg.given(s)}
    where = str(out) if out is not None else "stdout"
    print(
        f"rlcore from-verl: {len(given)} verl keys set in {', '.join(result.sources)}; "
        f"{len(mapped)} mapped; manifest written to {where}",
        file=stream,
    )
    for note in result.notes:
        print(f"  note: {note}", file=stream)
    for _key, origin, message in cfg.problems:
        print(f"  verl would refuse this: {message} ({origin})", file=stream)
    unmapped = sorted(conversion.unmapped, key=lambda u: (not u.essential, u.key))
    if unmapped:
        print(f"not mapped ({len(unmapped)}):", file=stream)
        for item in unmapped:
            value = cfg.get(item.key)
            origin = f" ({item.origin})" if item.origin else " (verl's default)"
            mark = "ESSENTIAL " if item.essential else ""
            print(f"  {mark}{item.key} = {value!r}{origin}: {item.reason}", file=stream)
    if result.unknown:
        print(f"not verl keys ({len(result.unknown)}):", file=stream)
        for key, (origin, added) in result.unknown.items():
            near = cfg.suggestion(key)
            hint = f"; did you mean {near}?" if near else ""
            kind = "added with '+', verl does not read it" if added else "verl refuses it (not in its config)"
            print(f"  {key} ({origin}): {kind}{hint}", file=stream)
    if result.failed:
        print(
            "something essential did not map (above); the manifest does not do what the verl run does",
            file=stream,
        )
    else:
        target = out if out is not None else "FILE"
        print(f"everything essential mapped; check it with: rlcore validate {target}", file=stream)
