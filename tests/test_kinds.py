"""The table of kinds (rlcore/kinds.py) agrees with the hook specifications, the manifest schema,
the protocols and the conformance kits: a kind described in one place only cannot drift."""

from __future__ import annotations

import importlib
import inspect

from rlcore import hookspecs, kinds
from rlcore.components import KINDS
from rlcore.manifest.schema import COMPONENT_MAPS, COMPONENT_TABLES, Manifest
from rlcore.registry import FIRST_PARTY

# Hooks that return records of something other than a component kind.
NOT_KINDS = {"rlcore_commands"}


def _resolve(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def test_every_component_hookspec_is_a_kind_and_every_kind_a_hookspec():
    specs = {
        name for name, f in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("rlcore_")
    }
    assert specs - NOT_KINDS == set(kinds.BY_HOOK)
    for kind in kinds.KINDS:
        doc = getattr(hookspecs, kind.hook).__doc__ or ""
        assert doc.strip(), f"{kind.hook} has no docstring"
        if kind.selector:  # the spec says how a manifest selects it
            assert f"[{kind.table}] {kind.selector}" in doc or f"[{kind.table}]" in doc, (
                kind.hook,
                kind.table,
            )


def test_manifest_tables_come_from_the_kinds():
    assert COMPONENT_TABLES == kinds.selectors() and COMPONENT_MAPS == kinds.named_tables()
    for kind in kinds.KINDS:
        # chosen otherwise (a data source by its prefix, a harness on the command line)
        if kind.table is None:
            continue
        assert kind.table in Manifest.model_fields, f"{kind.name}: no [{kind.table}] table in the manifest"
        model = Manifest.model_fields[kind.table].annotation
        if kind.named:
            assert kind.selector is None
        else:
            assert kind.selector in model.model_fields, (
                f"{kind.name}: [{kind.table}] has no key {kind.selector!r}"
            )


def test_protocols_kits_and_registry_views_agree():
    assert list(KINDS) == [k.name for k in kinds.KINDS]
    assert all(KINDS[k.name] == (k.hook, k.description) for k in kinds.KINDS)
    for kind in kinds.KINDS:
        assert inspect.isclass(_resolve(kind.protocol)), kind.protocol
        if kind.kit is not None:
            assert callable(_resolve(kind.kit)), kind.kit
    assert FIRST_PARTY == kinds.install_hints()
    assert all(dist.startswith("rlcore-") for dist in FIRST_PARTY.values())
