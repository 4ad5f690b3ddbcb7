"""The registry: discovery, stamping, conflicts, broken plugins, lookups with suggestions."""

from __future__ import annotations

import types

import pytest

import rlcore
from rlcore.components import Component
from rlcore.errors import ConflictError, UnknownComponentError
from rlcore.registry import Registry


def _reward_plugin(name):
    class Plugin:
        @rlcore.hookimpl
        def rlcore_reward_functions(self):
            return [Component(name, "builtins:dict", description="x")]

    return Plugin()


def test_builtins_register_through_the_hooks():
    registry = Registry.discover(external=False)
    assert "local" in registry.components("launcher")
    assert {"console", "jsonl"} <= set(registry.components("metrics_sink"))
    local = registry.get("launcher", "local")
    assert local.distribution == "rlcore" and local.version == rlcore.__version__
    assert local.kind == "launcher"


def test_records_are_stamped_with_their_distribution(rlcore_registry, rlcore_register):
    rlcore_register(_reward_plugin("r1"), name="p1", distribution="rlcore-p1", version="1.0")
    component = rlcore_registry.get("reward_function", "r1")
    assert (component.distribution, component.version, component.plugin) == ("rlcore-p1", "1.0", "p1")


def test_a_name_provided_twice_is_an_error_naming_both(rlcore_registry, rlcore_register):
    rlcore_register(_reward_plugin("same"), name="a", distribution="pkg-a", version="1.0")
    rlcore_register(_reward_plugin("same"), name="b", distribution="pkg-b", version="2.0")
    with pytest.raises(ConflictError) as info:
        rlcore_registry.get("reward_function", "same")
    assert "pkg-a 1.0" in str(info.value) and "pkg-b 2.0" in str(info.value)
    assert rlcore_registry.conflicts()[("reward_function", "same")] == ["pkg-a 1.0", "pkg-b 2.0"]


def test_a_misspelled_hook_marks_the_plugin_broken(rlcore_registry, rlcore_register):
    class Misspelled:
        @rlcore.hookimpl
        def rlcore_reward_function(self):  # singular: matches no spec
            return []

    info = rlcore_register(Misspelled(), name="typo")
    assert info.status == "broken"
    assert "rlcore_reward_functions" in info.error  # the did-you-mean
    assert "local" in rlcore_registry.components("launcher")  # the rest still works


def test_a_hook_that_raises_or_returns_garbage_marks_its_plugin_broken(rlcore_registry, rlcore_register):
    class Raises:
        @rlcore.hookimpl
        def rlcore_reward_functions(self):
            raise RuntimeError("boom")

    class Garbage:
        @rlcore.hookimpl
        def rlcore_tools(self):
            return ["not a record"]

    rlcore_register(Raises(), name="raises")
    rlcore_register(Garbage(), name="garbage")
    rlcore_register(_reward_plugin("fine"), name="fine")
    infos = {i.name: i for i in rlcore_registry.plugin_infos()}
    assert infos["raises"].status == "broken" and "boom" in infos["raises"].error
    assert infos["garbage"].status == "broken" and "Component" in infos["garbage"].error
    assert rlcore_registry.get("reward_function", "fine").name == "fine"


def test_unknown_names_suggest_the_closest_and_list_what_is_available(rlcore_registry, rlcore_register):
    rlcore_register(_reward_plugin("exact_match_v2"), name="p")
    with pytest.raises(UnknownComponentError) as info:
        rlcore_registry.get("reward_function", "exact_matc_v2")
    message = str(info.value)
    assert "did you mean 'exact_match_v2'" in message and "available:" in message


def test_unknown_first_party_names_say_which_distribution_to_install(rlcore_registry):
    with pytest.raises(UnknownComponentError) as info:
        rlcore_registry.get("rollout_engine", "vllm")
    assert "pip install rlcore-rollout-vllm" in str(info.value)


def test_records_validate_their_fields():
    with pytest.raises(TypeError):
        Component("", "m:f")
    with pytest.raises(TypeError):
        Component("x", "no-colon")
    with pytest.raises(TypeError):
        Component("x", "m:f", options=dict)
    with pytest.raises(TypeError):
        Component("x", "m:f", needs={"a_gpu_please"})


def test_factories_are_lazy_and_build_with_validated_options(rlcore_registry, rlcore_register):
    from pydantic import ValidationError

    from rlcore.components import Options

    class Opt(Options):
        k: int = 1

    module = types.ModuleType("lazy_mod")

    @rlcore.hookimpl
    def rlcore_reward_functions():
        return [Component("lazy", "json:loads", Opt)]

    module.rlcore_reward_functions = rlcore_reward_functions
    rlcore_register(module, name="lazy_mod")
    component = rlcore_registry.get("reward_function", "lazy")
    assert component.load_factory().__name__ == "loads"
    with pytest.raises(ValidationError):
        component.build({"k": "not an int"})


def test_disabled_and_external_switches(monkeypatch):
    monkeypatch.setenv("RLCORE_NO_PLUGINS", "1")
    registry = Registry.discover()
    assert [i.name for i in registry.plugin_infos()] == ["rlcore.builtin"]
