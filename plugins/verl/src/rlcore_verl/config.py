"""One verl run's configuration: verl's defaults, then a YAML config, then the command line's
overrides, each key remembering where its value came from (so every manifest line can say)."""

from __future__ import annotations

import re
from typing import Any

from rlcore.errors import did_you_mean
from rlcore_verl.hydra import Override, convert_primitive, flatten
from rlcore_verl.verl_defaults import OPEN_TABLES, defaults_for

_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")


class VerlConfig:
    def __init__(self, module: str = "verl.trainer.main_ppo") -> None:
        self.module = module
        self.defaults, self.native = defaults_for(module)
        self.values: dict[str, Any] = dict(self.defaults)
        self.origins: dict[str, str] = {}  # key -> where it was set; absent: verl's default
        self.problems: list[
            tuple[str, str, str]
        ] = []  # (key, origin, message): overrides verl itself refuses
        self.unknown: dict[
            str, tuple[str, bool]
        ] = {}  # keys verl does not have -> (where set, added with "+")

    # Building -------------------------------------------------------------------------------

    def apply_yaml(self, flat: dict[str, Any], origin: str) -> None:
        """A YAML config's leaves. Those equal to verl's default count as defaults: a run's saved
        config repeats every default, its interpolations resolved (``rollout_n: 5``)."""
        changed = {}
        for key, value in flat.items():
            if (
                key == "defaults"
                or (key in self.defaults and self.defaults[key] == value)
                or _inert(key, value)
            ):
                continue
            changed[key] = value
            self.values[key] = value
        for key, value in changed.items():
            if key in self.defaults and self._resolve(self.defaults[key], key, 0) == value:
                continue  # verl's interpolated default, as the saved config resolved it
            if not self.is_known(key):
                self.unknown[key] = (origin, False)
            self.set(key, value, origin)

    def apply_override(self, override: Override) -> None:
        key, origin = override.key, override.origin
        if override.op == "delete":
            removed = [k for k in self.values if k == key or k.startswith(key + ".")]
            if not removed:
                self.problems.append((key, origin, f"~{key}: verl has no such key to delete"))
            for k in removed:
                self.values.pop(k)
                self.origins[k] = origin
            return
        if not self.is_known(key) and not self.is_section(key):
            # Without "+", verl refuses it too ("Key 'x' is not in struct"); with it, verl takes it
            # but its code does not read it.
            self.unknown[key] = (origin, override.op != "set")
        if override.op == "add" and key in self.native:
            self.problems.append(
                (
                    key,
                    origin,
                    f"+{key}: verl already has this key (Hydra refuses '+' on it); write {key}=... instead",
                )
            )
        elif override.op == "set" and key in self.defaults and key not in self.native:
            self.problems.append(
                (
                    key,
                    origin,
                    f"{key}: {self.module}'s config has no such key (the DAPO recipe's); Hydra refuses it "
                    f"without '+': write +{key}=...",
                )
            )
        self.set(key, override.value, origin)

    def set(self, key: str, value: Any, origin: str) -> None:
        if isinstance(value, dict) and not self.is_open_table(key) and (self.is_section(key) or value):
            for sub, sub_value in flatten(value, key + ".").items():
                self.set(sub, sub_value, origin)
            return
        for k in [k for k in self.values if k.startswith(key + ".")]:  # a section replaced by a value
            self.values.pop(k)
        self.values[key] = value
        self.origins[key] = origin

    # Questions ------------------------------------------------------------------------------

    def is_open_table(self, key: str) -> bool:
        return key in OPEN_TABLES

    def is_section(self, key: str) -> bool:
        return any(k.startswith(key + ".") for k in self.defaults)

    def is_known(self, key: str) -> bool:
        """A key verl has: one of its defaults, inside a free-form table, or a documented subtree
        (profilers, ``_target_``)."""
        if key in self.defaults or any(key.startswith(t + ".") for t in OPEN_TABLES):
            return True
        from rlcore_verl.mapping import explained_by_prefix

        return explained_by_prefix(key) is not None

    def given(self, key: str) -> bool:
        return key in self.origins

    def origin(self, key: str) -> str | None:
        return self.origins.get(key)

    def given_keys(self) -> list[str]:
        return list(self.origins)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` with verl's interpolations resolved."""
        if key not in self.values:
            return default
        return self._resolve(self.values[key], key, depth=0)

    def table(self, key: str) -> dict[str, Any]:
        """The entries under ``key`` (a free-form table such as engine_kwargs.vllm), resolved."""
        out: dict[str, Any] = {}
        value = self.get(key)
        if isinstance(value, dict):
            out.update(value)
        for k in self.values:
            if k.startswith(key + "."):
                out[k[len(key) + 1 :]] = self.get(k)
        return out

    def suggestion(self, key: str) -> str | None:
        return did_you_mean(key, self.defaults)

    # Interpolations ---------------------------------------------------------------------------

    def _resolve(self, value: Any, key: str, depth: int) -> Any:
        if not isinstance(value, str) or "${" not in value or depth > 16:
            return value
        whole = _INTERPOLATION.fullmatch(value.strip())
        if whole:
            return self._resolve(self._lookup(whole.group(1), key, depth), key, depth + 1)
        return _INTERPOLATION.sub(lambda m: str(self._lookup(m.group(1), key, depth)), value)

    def _lookup(self, expression: str, key: str, depth: int) -> Any:
        default: Any = None
        target = expression.strip()
        if target.startswith("oc.select:"):
            target, _, fallback = target[len("oc.select:") :].partition(",")
            default = convert_primitive(fallback.strip().strip("'\"")) if fallback else None
            target = target.strip()
        if target.startswith("."):  # relative to the key's own section
            target = key.rsplit(".", 1)[0] + target
        if target in self.values:
            return self._resolve(self.values[target], target, depth + 1)
        return default


def _inert(key: str, value: Any) -> bool:
    """A saved config's bookkeeping, not a setting: config class names, and profiler options
    while that profiler is not enabled."""
    if key.endswith("._target_"):
        return True
    return (".profiler." in key or key.startswith("global_profiler.global_tool_config.")) and not (
        key.endswith(".profiler.enable") and value is True
    )
