"""Read-only facts about the manifest format, for plugins that write manifests.

A converter such as rlcore-verl's ``from-verl`` needs rlcore's defaults to leave out what would
not change anything: the core tables' fields and an installed component's options. The schema and
the registry stay internal (they change as the core does); this module is the part of them that
a plugin may rely on, and it is in the plugin API.
"""

from __future__ import annotations

import types
import typing
from functools import lru_cache

from pydantic import BaseModel


def core_table(path: str) -> type[BaseModel] | None:
    """The pydantic model of the core table at ``path`` (``"trainer"``, ``"model.lora"``), or
    None where the core has no such table (a component's own table, a typo)."""
    from rlcore.manifest.schema import Manifest

    model: type[BaseModel] = Manifest
    for part in path.split("."):
        field = model.model_fields.get(part)
        table = _model_of(field.annotation) if field is not None else None
        if table is None:
            return None
        model = table
    return model


def component_options(kind: str, name: str) -> type[BaseModel] | None:
    """The options model of the installed component ``name`` of ``kind``, or None where no
    installed plugin provides it."""
    from rlcore.errors import RlcoreError

    try:
        return _registry().get(kind, name).options
    except RlcoreError:
        return None


def _model_of(annotation) -> type[BaseModel] | None:
    """The table model inside an annotation such as ``LoraTable | None``; None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [m for m in map(_model_of, typing.get_args(annotation)) if m is not None]
        return models[0] if len(models) == 1 else None
    return None


@lru_cache(maxsize=1)
def _registry():
    from rlcore.registry import Registry

    return Registry.discover()
