"""Finding a verifiers environment and checking that rlcore can play it.

An environment is named three ways in a manifest:

* ``PACKAGE``: an installed taskset package, as verifiers itself loads one (the module exports
  its ``Taskset`` subclass, and optionally an ``Env`` subclass, in ``__all__``);
* ``PACKAGE:NAME`` or ``package.module:NAME``: the ``Taskset`` subclass ``NAME`` of a module;
* ``python:FILE.py`` or ``python:FILE.py:NAME``: a file (relative to the manifest), with the same
  rules.

``NAME`` may also name an ``Env`` subclass: then its taskset is the module's one. verifiers is
imported here only inside functions (it is pure Python and never imports torch), so the plugin
registers without it.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from rlcore.errors import RlcoreError, did_you_mean
from rlcore.targets import import_file

FILE_PREFIX = "python:"
SUPPORTED_HARNESSES = ("null",)  # the tool-less chat loop: what rlcore plays itself


@dataclass(frozen=True)
class EnvRef:
    """Where an environment's code is: a module name or an absolute file, and maybe a name in it."""

    module: str
    name: str = ""
    is_file: bool = False

    @property
    def spec(self) -> str:
        """The canonical form, written into every row (the reward and the loop load from it)."""
        head = f"{FILE_PREFIX}{self.module}" if self.is_file else self.module
        return f"{head}:{self.name}" if self.name else head

    @property
    def label(self) -> str:
        """A short name for ``data_source``: the package, or the file's stem."""
        base = Path(self.module).stem if self.is_file else self.module.split(".")[0]
        return f"{base}.{self.name}" if self.name else base


def parse_env(text: str, manifest_dir: str | None = None) -> EnvRef:
    """``text`` as an :class:`EnvRef`; a relative file is taken relative to ``manifest_dir``."""
    text = text.strip()
    if not text:
        raise RlcoreError(
            "name an environment: verifiers:PACKAGE, verifiers:PACKAGE:NAME or verifiers:python:FILE.py[:NAME]"
        )
    if text.startswith(FILE_PREFIX):
        body = text[len(FILE_PREFIX) :]
        path, name = (body, "") if body.endswith(".py") else body.rpartition(":")[::2]
        if not path.endswith(".py"):
            raise RlcoreError(f"{text!r}: expected python:FILE.py or python:FILE.py:NAME")
        file = Path(path).expanduser()
        if not file.is_absolute():
            file = Path(manifest_dir or ".") / file
        if not file.is_file():
            raise RlcoreError(
                f"environment file {str(file)!r} does not exist"
                + ("" if manifest_dir else " (relative paths are read from the manifest's directory)")
            )
        return EnvRef(str(file.resolve()), name, is_file=True)
    module, _, name = text.partition(":")
    if not module.replace(".", "_").replace("-", "_").isidentifier():
        raise RlcoreError(f"{text!r}: {module!r} is not a Python package name (a file is python:FILE.py)")
    return EnvRef(module.replace("-", "_"), name)


def load_module(ref: EnvRef) -> Any:
    if ref.is_file:
        return import_file(Path(ref.module), "verifiers environment")
    try:
        return importlib.import_module(ref.module)
    except ModuleNotFoundError as exc:
        if exc.name and ref.module.startswith(exc.name):
            raise RlcoreError(
                f"verifiers environment package {ref.module!r} is not installed (pip install it, or name a file: "
                "verifiers:python:FILE.py)"
            ) from None
        raise RlcoreError(f"importing verifiers environment {ref.module!r} failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed while importing
        raise RlcoreError(
            f"importing verifiers environment {ref.module!r} failed: {type(exc).__name__}: {exc}"
        ) from None


def _exported(module: Any) -> list[Any]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return [getattr(module, n, None) for n in names]


def _subclasses(module: Any, base: type, *, own_only: bool) -> list[type]:
    found = []
    for obj in _exported(module):
        if (
            isinstance(obj, type)
            and issubclass(obj, base)
            and obj is not base
            and not inspect.isabstract(obj)
        ):
            if own_only and getattr(module, "__all__", None) is None and obj.__module__ != module.__name__:
                continue  # a class the file merely imported
            found.append(obj)
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class EnvClasses:
    """What an environment's code provides: its taskset class and its Env class (None: the
    single-agent env verifiers gives every plain taskset)."""

    ref: EnvRef
    taskset: type
    env: type | None


def env_classes(ref: EnvRef) -> EnvClasses:
    """The taskset and Env classes ``ref`` names; a located RlcoreError otherwise."""
    return _env_classes(ref)


@cache
def _env_classes(ref: EnvRef) -> EnvClasses:
    import verifiers.v1 as vf

    module = load_module(ref)
    where = f"verifiers environment {ref.spec!r}"
    tasksets = _subclasses(module, vf.Taskset, own_only=True)
    envs = _subclasses(module, vf.Env, own_only=True)
    if ref.name:
        obj = getattr(module, ref.name, None)
        if obj is None:
            names = sorted(c.__name__ for c in tasksets + envs)
            hint = did_you_mean(ref.name, names)
            raise RlcoreError(
                f"{where}: no {ref.name!r} in it"
                + (f"; did you mean {hint!r}?" if hint else "")
                + f"; its Taskset and Env classes: {', '.join(names) or 'none'}"
            )
        if isinstance(obj, type) and issubclass(obj, vf.Taskset):
            tasksets = [obj]
        elif isinstance(obj, type) and issubclass(obj, vf.Env):
            envs = [obj]
        else:
            raise RlcoreError(
                f"{where}: {ref.name!r} is a {type(obj).__name__}, not a verifiers Taskset or Env class"
            )
    if len(tasksets) != 1:
        what = "no" if not tasksets else f"{len(tasksets)} ({', '.join(c.__name__ for c in tasksets)})"
        raise RlcoreError(
            f"{where} exports {what} Taskset subclasses; export exactly one (in __all__), or name it "
            f"as {ref.spec if ref.name else ref.spec + ':NAME'}"
        )
    if len(envs) > 1:
        raise RlcoreError(
            f"{where} exports {len(envs)} Env subclasses ({', '.join(c.__name__ for c in envs)}); "
            "export one, or name it"
        )
    return EnvClasses(ref, tasksets[0], envs[0] if envs else None)


# ----------------------------------------------------------------------------- configs


def taskset_config_type(classes: EnvClasses) -> type:
    import verifiers.v1 as vf
    from verifiers.v1.utils.generic import concrete_type

    return concrete_type(classes.taskset, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig


def env_config_type(classes: EnvClasses) -> type:
    import verifiers.v1 as vf
    from verifiers.v1.utils.generic import concrete_type

    if classes.env is None:
        return vf.SingleAgentEnvConfig
    return concrete_type(classes.env, vf.EnvConfig, origin=vf.Env) or vf.EnvConfig


def _problems(exc: Any, prefix: str) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e["loc"])
        message = str(e["msg"]).removeprefix("Value error, ")
        parts.append(f"{prefix}{loc}: {'unknown option' if e['type'] == 'extra_forbidden' else message}")
    return "; ".join(parts)


def _options_of(model: type, skip: tuple[str, ...] = ()) -> list[str]:
    return [name for name in model.model_fields if name not in skip]


def taskset_config(classes: EnvClasses, options: dict[str, Any]) -> Any:
    """The taskset's own config from the source's extra options, checked key by key."""
    from pydantic import ValidationError

    config_type = taskset_config_type(classes)
    allowed = _options_of(config_type, ("id",))
    for key in options:
        if key not in allowed:
            hint = did_you_mean(key, allowed)
            raise RlcoreError(
                f"taskset {classes.taskset.__name__} has no option {key!r}"
                + (f"; did you mean {hint!r}?" if hint else "")
                + f"; its options: {', '.join(allowed) or 'none'} (and the source's own)"
            )
    # id stays empty: verifiers would import the taskset again by id, and rlcore has it already
    data = {**options, "id": ""}
    try:
        return config_type.model_validate(data)
    except ValidationError as exc:
        raise RlcoreError(f"taskset {classes.taskset.__name__}: {_problems(exc, '')}") from None


def env_config(classes: EnvClasses, taskset_cfg: Any, options: dict[str, Any]) -> Any:
    """The Env's config (its seats and knobs) from the source's ``env_options``."""
    from pydantic import ValidationError

    config_type = env_config_type(classes)
    allowed = _options_of(config_type, ("id", "taskset"))
    for key in options:
        if key not in allowed:
            hint = did_you_mean(key, allowed)
            raise RlcoreError(
                f"env_options: {config_type.__name__} has no option {key!r}"
                + (f"; did you mean {hint!r}?" if hint else "")
                + f"; its options: {', '.join(allowed)}"
            )
    try:
        return config_type.model_validate({**options, "taskset": taskset_cfg})
    except ValidationError as exc:
        raise RlcoreError(f"env_options: {_problems(exc, '')}") from None


def seats(env_cfg: Any) -> dict[str, Any]:
    from verifiers.v1.configs.agent import agent_config_fields

    return agent_config_fields(env_cfg)


# ----------------------------------------------------------------------------- what rlcore plays


def _overrides(cls: type, base: type, method: str) -> bool:
    return getattr(cls, method, None) is not getattr(base, method, None)


def _needs_runtime(fn: Any) -> bool:
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def unsupported(classes: EnvClasses, taskset_cfg: Any, env_cfg: Any) -> list[str]:
    """What this environment asks for that rlcore does not play (empty: rlcore plays all of it).
    Each entry says what and why; the reasons are those of the plugin's README."""
    import verifiers.v1 as vf

    problems: list[str] = []
    task_type = classes.taskset.task_type()
    where = f"task {task_type.__name__}"
    seat_configs = seats(env_cfg)
    if len(seat_configs) != 1:
        problems.append(
            f"env {env_config_type(classes).__name__} has {len(seat_configs)} seats ({', '.join(seat_configs)}); rlcore's "
            "policy plays one seat, and a second seat (a user simulator, an agentic judge) needs a second model"
        )
    for name, seat in seat_configs.items():
        harness = getattr(seat.harness, "id", None)
        if harness is not None and harness not in SUPPORTED_HARNESSES:
            problems.append(
                f"seat {name!r} pins the harness {harness!r}: harness programs (and their sandboxes) talk to a model "
                "over HTTP, outside rlcore's token-in, token-out loop; rlcore plays the `null` chat loop"
            )
        if seat.model is not None or seat.client is not None:
            problems.append(
                f"seat {name!r} names its own model or client: rlcore's policy plays every seat it trains"
            )
    module = importlib.import_module(classes.taskset.__module__)
    if any(
        isinstance(o, type) and issubclass(o, vf.Harness) and o is not vf.Harness for o in _exported(module)
    ):
        problems.append(
            f"{classes.ref.spec!r} ships its own Harness: harness programs are not played by rlcore"
        )
    for hook in ("setup", "finalize", "stage_verifier", "validate"):
        if _overrides(task_type, vf.Task, hook):
            problems.append(f"{where} overrides {hook}(), which runs in a sandbox runtime; rlcore has none")
    if getattr(task_type, "NEEDS_CONTAINER", False):
        problems.append(f"{where} needs a container (NEEDS_CONTAINER)")
    task = task_type(task_type.data_type().model_construct(), taskset_cfg.task)  # hooks only: no data needed
    for kind in ("reward", "metric", "stop"):
        for fn in task.hooks(kind):
            if _needs_runtime(fn):
                problems.append(
                    f"{where}: @vf.{kind} {fn.__name__} needs a runtime (a sandbox); rlcore has none"
                )
    from verifiers.v1.utils.decorators import discover_decorated

    for fn in discover_decorated(task, "intercept"):
        problems.append(
            f"{where}: @vf.intercept {fn.__name__} is an interception-server hook; rlcore has no "
            "interception server between the model and the program"
        )
    if taskset_cfg.task.judges:
        problems.append(
            f"{where}: judges ({', '.join(j.id for j in taskset_cfg.task.judges)}) call an LLM judge; "
            "use a reward model or an rlcore reward instead"
        )
    if classes.env is not None:
        for hook in ("start", "stop"):
            if _overrides(classes.env, vf.Env, hook):
                problems.append(
                    f"env {classes.env.__name__} overrides {hook}() (env-owned serving resources)"
                )
        if _overrides(classes.env, vf.Env, "finalize"):
            problems.append(
                f"env {classes.env.__name__} overrides finalize(): cross-agent judgement over an episode "
                "of several seats; rlcore's episode has one seat, judged by the task's own rewards"
            )
    return problems


def check_supported(classes: EnvClasses, taskset_cfg: Any, env_cfg: Any) -> None:
    problems = unsupported(classes, taskset_cfg, env_cfg)
    if problems:
        raise RlcoreError(
            f"verifiers environment {classes.ref.spec!r} uses what rlcore does not support: "
            + "; ".join(problems)
            + " (see plugins/verifiers/README.md)"
        )


@dataclass
class Loaded:
    """An environment ready to play: its classes, taskset and env configs, and its taskset."""

    classes: EnvClasses
    taskset_config: Any
    env_config: Any

    @property
    def seat(self) -> str:
        return next(iter(seats(self.env_config)))

    @property
    def seat_config(self) -> Any:
        return seats(self.env_config)[self.seat]

    def taskset(self) -> Any:
        return self.classes.taskset(self.taskset_config)

    def task(self, data: dict[str, Any]) -> Any:
        """The task of a row (its wire data)."""
        task_type = self.classes.taskset.task_type()
        return task_type(task_type.data_type().model_validate(data), self.taskset_config.task)

    def env(self) -> Any:
        """The Env object whose ``setup``/``run``/``finalize`` rlcore calls (not ``__init__``, which
        loads harnesses and serving resources rlcore does not use)."""
        import verifiers.v1 as vf

        cls = self.classes.env or vf.SingleAgentEnv
        env = cls.__new__(cls)
        env.config = self.env_config
        env.taskset = self.taskset()
        return env


def load(
    spec: str, taskset_options: dict[str, Any], env_options: dict[str, Any], manifest_dir: str | None = None
) -> Loaded:
    """Everything a spec and its options name, checked (a located RlcoreError otherwise)."""
    classes = env_classes(parse_env(spec, manifest_dir))
    tcfg = taskset_config(classes, taskset_options)
    ecfg = env_config(classes, tcfg, env_options)
    check_supported(classes, tcfg, ecfg)
    return Loaded(classes, tcfg, ecfg)


@lru_cache(maxsize=64)
def _load_cached(spec: str, taskset_json: str, env_json: str) -> Loaded:
    import json

    return load(spec, json.loads(taskset_json), json.loads(env_json))


def load_from_row(info: dict[str, Any]) -> Loaded:
    """The environment a row names (``extra_info.verifiers``), loaded once per process."""
    import json

    return _load_cached(
        info["env"],
        json.dumps(info.get("taskset_options") or {}, sort_keys=True),
        json.dumps(info.get("env_options") or {}, sort_keys=True),
    )
