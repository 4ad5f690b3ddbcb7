"""docs/from-verl.md names real manifest keys: every ``[table] key`` it gives exists in the core
schema or in the options of an installed component of that table."""

from __future__ import annotations

import re
from pathlib import Path

from rlcore.manifest.schema import COMPONENT_MAPS, COMPONENT_TABLES, Manifest
from rlcore.registry import Registry

PAGE = Path(__file__).resolve().parents[1] / "docs" / "from-verl.md"
KEY = re.compile(r"`\[(\w+)(\.[^\]]*)?\] (\w+)")


def _keys_of(table: str, sub: str, registry: Registry) -> set[str]:
    if (table, sub) == ("model", ".lora"):
        from rlcore.manifest.schema import LoraTable

        return set(LoraTable.model_fields)
    if table in ("filters", "shapers") and sub:  # [filters.dynamic_sampling]: that component's options
        component = registry.components(COMPONENT_MAPS[table]).get(sub[1:])
        return set(component.options.model_fields) if component else set()
    model = Manifest.model_fields[table].annotation
    keys = set(getattr(model, "model_fields", {}))
    for _, kind in COMPONENT_TABLES.get(table, []):
        for component in registry.components(kind).values():
            keys |= set(component.options.model_fields)
    if table == "loggers":
        for component in registry.components("metrics_sink").values():
            keys |= set(component.options.model_fields)
    if table == "tools":
        for component in registry.components("tool").values():
            keys |= set(component.options.model_fields)
    return keys


def test_every_manifest_key_on_the_page_exists():
    registry = Registry.discover()
    named = KEY.findall(PAGE.read_text(encoding="utf-8"))
    assert len(named) > 40
    unknown = [
        f"[{t}{s}] {k}"
        for t, s, k in named
        if t not in Manifest.model_fields or k not in _keys_of(t, s, registry)
    ]
    assert not unknown, unknown
