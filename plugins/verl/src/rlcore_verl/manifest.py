"""Writing a conversion as a TOML manifest, each line commented with the verl keys it came from.

A line whose value comes from verl's defaults alone is written only where rlcore's default
differs (verl's ``max_response_length`` of 512 against rlcore's 256); rlcore's defaults are read
through ``rlcore.manifest_api`` (the core tables and the installed components' options), so
nothing is imported but pydantic models.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from rlcore.manifest_api import component_options, core_table
from rlcore_verl.mapping import Conversion, Line
from rlcore_verl.verl_defaults import VERL_COMMIT

TABLE_ORDER = (
    "run",
    "model",
    "model.lora",
    "data",
    "rollout",
    "reward",
    "algorithm",
    "filters.dynamic_sampling",
    "shapers.overlong",
    "critic",
    "agent",
    "trainer",
    "loggers.wandb",
    "launcher",
)
# For a component table: the key that names the component, and the component's kind.
SELECTORS = {
    "rollout": (("engine", "rollout_engine"),),
    "reward": (("function", "reward_function"),),
    "algorithm": (("advantage", "advantage_estimator"), ("policy_loss", "policy_loss")),
    "agent": (("loop", "agent_loop"),),
    "launcher": (("name", "launcher"),),
}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_MISSING = object()


def render(conversion: Conversion, sources: list[str]) -> str:
    lines = [line for line in conversion.lines if keep(line, conversion)]
    tables = {t: [line for line in lines if line.table == t] for t in TABLE_ORDER}
    out = [
        f"# Written by `rlcore from-verl` from {', '.join(sources)} (verl's keys as of verl {VERL_COMMIT}).",
        '# Each line names the verl key it came from; "verl\'s default" marks a value the verl command',
        "# left at verl's default, written because rlcore's default differs. Check it: rlcore validate FILE",
    ]
    for table, table_lines in tables.items():
        if not table_lines:
            continue
        out += ["", f"[{table}]"]
        rendered = [
            (f"{toml_key(line.key)} = {toml_value(line.value)}", comment(line, conversion))
            for line in table_lines
        ]
        width = min(max(len(text) for text, _ in rendered), 48)
        out += [f"{text:<{width}}  # {note}" for text, note in rendered]
    essential = [u for u in conversion.unmapped if u.essential]
    if essential:
        out += [
            "",
            "# NOT MAPPED, and it changes what is trained (every key that did not map is listed on stderr):",
        ]
        out += [f"#   {item.key}: {item.reason}" for item in essential]
    return "\n".join(out) + "\n"


def comment(line: Line, conversion: Conversion) -> str:
    """The verl keys a line came from: those the command set, or (none set) all, as verl's defaults."""
    if not line.sources:
        return line.note
    given = [s for s in line.sources if conversion.cfg.given(s)]
    text = "verl: " + ", ".join(given or line.sources)
    if not given:
        text += " (verl's default)"
    return f"{text}; {line.note}" if line.note else text


def keep(line: Line, conversion: Conversion) -> bool:
    """A line the user's settings gave, or one where verl's default differs from rlcore's."""
    if line.value is None:
        return False
    if line.given:
        return True
    default = rlcore_default(line.table, line.key, conversion)
    return default is _MISSING or normalise(default) != normalise(line.value)


def normalise(value: Any) -> Any:
    if isinstance(value, tuple):
        return [normalise(v) for v in value]
    if isinstance(value, list):
        return [normalise(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def rlcore_default(table: str, key: str, conversion: Conversion) -> Any:
    """rlcore's default for ``[table] key``: the core table's, else the option's of the component
    the manifest selects there; _MISSING when there is none (a required key, or an unknown one)."""
    from pydantic_core import PydanticUndefined

    model = core_table(table)
    if model is not None and key in model.model_fields:
        field = model.model_fields[key]
        if field.default_factory is not None:
            return field.default_factory()
        return _MISSING if field.default is PydanticUndefined else field.default
    if table.startswith("loggers."):
        components = [("metrics_sink", table.split(".", 1)[1])]
    else:
        components = []
        for selector, kind in SELECTORS.get(table, ()):
            name = conversion.value_of(table, selector)
            if name is None and model is not None:
                name = model.model_fields[selector].default
            if isinstance(name, str):
                components.append((kind, name))
    for kind, name in components:
        options = component_options(kind, name)
        if options is not None and key in options.model_fields:
            field = options.model_fields[key]
            if field.default_factory is not None:
                return field.default_factory()
            return _MISSING if field.default is PydanticUndefined else field.default
    return _MISSING


def toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        items = [f"{toml_key(str(k))} = {toml_value(v)}" for k, v in value.items() if v is not None]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    return json.dumps(str(value))
