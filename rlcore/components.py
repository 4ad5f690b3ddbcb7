"""The typed record every hook returns (the kinds themselves are described in rlcore/kinds.py).

A record travels with everything the manifest layer needs (name, options model,
description, needs) and a *lazy* factory, so listing and validating plugins never
imports torch, vllm or ray. The registry stamps each record with the distribution
that provided it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from rlcore import kinds as _kinds


class Options(BaseModel):
    """Base for a component's manifest options: unknown keys are rejected.

    ``memory_options`` (a class attribute) names the options that bound the memory the component
    takes, for out-of-memory messages (an engine's batch size or memory fraction)."""

    model_config = ConfigDict(extra="forbid")
    memory_options: ClassVar[tuple[str, ...]] = ()


class NoOptions(Options):
    """A component that takes no options."""


# kind -> (hook name, one-line description). The order is the order of `rlcore plugins`., from the one table of kinds (rlcore/kinds.py).
KINDS: dict[str, tuple[str, str]] = {kind.name: (kind.hook, kind.description) for kind in _kinds.KINDS}

# Needs a component may declare; the trainer provisions the matching role.
# "groups": the component is meaningless with one sample per prompt (group baselines).
KNOWN_NEEDS = frozenset({"critic", "reference", "tokenizer", "actor_model", "groups"})


@dataclass(frozen=True)
class Component:
    """One registered implementation of a component kind.

    name:        the name a manifest uses (``engine = "hf"``).
    factory:     ``"package.module:attr"`` or a callable. It is imported and called only
                 when a run builds the component: ``factory(options, context)``.
    options:     a pydantic model (subclass of :class:`Options`) for the component's
                 manifest keys. Validated by ``rlcore validate`` without calling the factory.
    description: one line for ``rlcore plugins``.
    needs:       roles the component requires, e.g. ``{"critic"}`` for GAE.
    target_option: the option a manifest may give inline as ``NAME:TARGET``, where TARGET names
                 code (``FILE.py:FUNCTION`` relative to the manifest, or ``package.module:FUNCTION``):
                 the builtin ``python`` reward declares ``"target"``, so ``function =
                 "python:rewards.py:score"`` selects it with ``target = "rewards.py:score"``.
    selected_by: an option whose presence in a ``[tools.NAME]`` (or ``[loggers.NAME]``) table
                 selects this component when NAME itself is not a registered one: the ``function``
                 tool declares ``"function"``, so ``[tools.calculator] function = "..."`` uses it.
    default:     this component is its kind's default, used when a manifest leaves the selecting
                 key out (``[rollout] engine``, ``[algorithm] advantage``) and written by ``rlcore
                 init`` (which also picks the default reward function): the core names no plugin's
                 component itself. At most one installed component of a kind may declare it.
    kind, distribution, version: filled in by the registry, never by the plugin.
    """

    name: str
    factory: str | Callable[..., Any]
    options: type[BaseModel] = NoOptions
    description: str = ""
    needs: frozenset[str] = field(default_factory=frozenset)
    target_option: str = ""
    selected_by: str = ""
    default: bool = False
    kind: str = ""
    distribution: str = ""
    version: str = ""
    plugin: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"component name must be a non-empty string, got {self.name!r}")
        if not (callable(self.factory) or (isinstance(self.factory, str) and ":" in self.factory)):
            raise TypeError(
                f"component {self.name!r}: factory must be a callable or 'module:attribute', got {self.factory!r}"
            )
        if not (isinstance(self.options, type) and issubclass(self.options, BaseModel)):
            raise TypeError(f"component {self.name!r}: options must be a pydantic model class")
        object.__setattr__(self, "needs", frozenset(self.needs))
        for option in (self.target_option, self.selected_by):
            if option and option not in self.options.model_fields:
                raise TypeError(f"component {self.name!r}: {option!r} is not one of its options")
        unknown = self.needs - KNOWN_NEEDS
        if unknown:
            raise TypeError(
                f"component {self.name!r}: unknown needs {sorted(unknown)}; known: {sorted(KNOWN_NEEDS)}"
            )

    def stamped(self, **where: str) -> Component:
        return replace(self, **where)

    @property
    def provider(self) -> str:
        return f"{self.distribution} {self.version}".strip() or "(unregistered)"

    def load_factory(self) -> Callable[..., Any]:
        """Import the factory (the first moment heavy modules may be imported)."""
        if callable(self.factory):
            return self.factory
        from rlcore.targets import load_target

        return load_target(self.factory, what="factory")[0]

    def build(self, options: BaseModel | dict | None = None, context: Any = None) -> Any:
        """Validate ``options`` (a dict or an options instance) and call the factory."""
        if not isinstance(options, self.options):
            options = self.options.model_validate(options or {})
        return self.load_factory()(options, context)


@dataclass(frozen=True)
class Command:
    """An extra ``rlcore`` sub-command (hook ``rlcore_commands``); rlcore's own ``data``, ``eval``
    and ``plot`` are registered this way too, as are first-party plugins' (``serve``, ``jobs``).

    name:      the sub-command, ``rlcore <name>``.
    help:      one line for ``rlcore --help``.
    run:       ``run(args) -> int`` (an exit code), or ``"package.module:function"``.
    configure: ``configure(parser)`` adds the command's arguments to its argparse parser; a
               callable, ``"package.module:function"`` or None. A string is imported only when
               that command's parser is built (when the command is invoked or asked for its
               help), so registering a command imports nothing.
    distribution, plugin: filled in by the registry, never by the plugin.
    """

    name: str
    help: str
    run: str | Callable[..., int]
    configure: str | Callable[..., None] | None = None
    distribution: str = ""
    plugin: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"command name must be a non-empty string, got {self.name!r}")
        for field_name in ("run", "configure"):
            value = getattr(self, field_name)
            if field_name == "configure" and value is None:
                continue
            if not (callable(value) or (isinstance(value, str) and ":" in value)):
                raise TypeError(
                    f"command {self.name!r}: {field_name} must be a callable or 'module:function', got {value!r}"
                )

    def stamped(self, **where: str) -> Command:
        return replace(self, **where)

    def load_run(self) -> Callable[..., int]:
        if callable(self.run):
            return self.run
        from rlcore.targets import load_target

        return load_target(self.run, what="command")[0]

    def load_configure(self) -> Callable[..., None] | None:
        """The ``configure`` function, imported now if it was named by a string."""
        if self.configure is None or callable(self.configure):
            return self.configure
        from rlcore.targets import load_target

        return load_target(self.configure, what="function", source="command")[0]
