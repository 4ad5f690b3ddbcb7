"""A JSON Schema of the manifest with the installed components' options, for editor completion."""

from __future__ import annotations

from typing import Any

from rlcore.manifest.schema import COMPONENT_MAPS, COMPONENT_TABLES, Manifest
from rlcore.registry import Registry


def _inline(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    defs.update(schema.pop("$defs", {}))
    return schema


def manifest_json_schema(registry: Registry) -> dict[str, Any]:
    schema = Manifest.model_json_schema(ref_template="#/$defs/{model}")
    defs: dict[str, Any] = schema.setdefault("$defs", {})
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "rlcore manifest"
    for table, selectors in COMPONENT_TABLES.items():
        table_def = defs[Manifest.model_fields[table].annotation.__name__]  # type: ignore[union-attr]
        branches = []
        for field_name, kind in selectors:
            components = registry.components(kind)
            table_def["properties"][field_name]["enum"] = sorted(components)
            for name, component in sorted(components.items()):
                options = _inline(component.options.model_json_schema(ref_template="#/$defs/{model}"), defs)
                branches.append(
                    {
                        "if": {"properties": {field_name: {"const": name}}},
                        "then": {"properties": options.get("properties", {})},
                    }
                )
        if branches:
            table_def["allOf"] = branches
    for table, kind in COMPONENT_MAPS.items():
        properties = {}
        for name, component in sorted(registry.components(kind).items()):
            properties[name] = _inline(
                component.options.model_json_schema(ref_template="#/$defs/{model}"), defs
            )
        schema["properties"][table] = {
            "type": "object",
            "properties": properties,
            "additionalProperties": {"type": "object"},
        }
    return schema
