"""First-party plugins use the declared plugin API only (rlcore.testing.api.PLUGIN_API): no other
rlcore module, no other plugin's package. The check reads the sources with ast."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlcore.testing.api import (
    PLUGIN_API,
    ImportViolation,
    check_plugin_imports,
    describe_violations,
    is_plugin_api,
)

ROOT = Path(__file__).resolve().parents[1]  # the repository
PLUGINS = sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml"))


def _packages(plugin: Path) -> set[str]:
    """The plugin's own top-level packages (plugins/<name>/src/<package>/)."""
    return {p.parent.name for p in (plugin / "src").glob("*/__init__.py")}


def test_every_plugin_is_checked():
    assert len(PLUGINS) >= 9 and all(_packages(p) for p in PLUGINS), PLUGINS


@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda p: p.name)
def test_plugin_imports_only_the_plugin_api(plugin):
    files = sorted((plugin / "src").rglob("*.py"))
    assert files
    violations = check_plugin_imports(files, own=_packages(plugin), root=ROOT)
    assert not violations, describe_violations(violations)


def test_every_module_of_the_plugin_api_exists():
    import importlib.util

    for entry in PLUGIN_API:
        name = entry.removesuffix(".*")
        assert importlib.util.find_spec(name) is not None, f"PLUGIN_API names {name}, which does not exist"


@pytest.mark.parametrize(
    "module, allowed",
    [
        ("rlcore", True),
        ("rlcore.interfaces", True),
        ("rlcore.algorithms", True),
        ("rlcore.algorithms.masked", True),
        ("rlcore.engine_kit.weights", True),
        ("rlcore.testing.engines", True),
        ("rlcore.launching", True),
        ("rlcore.trainer", False),
        ("rlcore.trainer.rl", False),
        ("rlcore.manifest.loader", False),
        ("rlcore.registry", False),
        ("rlcore.cli", False),
        ("rlcore.errors_extra", False),
        ("rlcore.interfaces.x", False),
    ],
)
def test_is_plugin_api(module, allowed):
    assert is_plugin_api(module) is allowed


def test_the_check_finds_forbidden_imports_and_names_them(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text(
        "import os\n"
        "import torch\n"
        "import rlcore\n"
        "from rlcore import Component, hookimpl\n"
        "from rlcore.algorithms.masked import masked_mean\n"
        "from rlcore.engine_kit import options\n"
        "from . import sibling\n"
        "from rlcore_mine.options import Opts\n"
        "import rlcore.trainer.rl as rl\n"  # line 9
        "from rlcore import registry\n"  # line 10
        "def later():\n"
        "    from rlcore_other import thing\n"  # line 12
        "    import importlib\n"
        "    return importlib.import_module('rlcore.manifest.loader')\n"  # line 14
    )
    violations = check_plugin_imports([source], own={"rlcore_mine"}, root=tmp_path)
    assert [(v.line, v.module) for v in violations] == [
        (9, "rlcore.trainer.rl"),
        (10, "rlcore.registry"),
        (12, "rlcore_other"),
        (14, "rlcore.manifest.loader"),
    ]
    message = describe_violations(violations)
    assert "mod.py:9: imports rlcore.trainer.rl (not part of the plugin API)" in message
    assert "mod.py:12: imports rlcore_other (another plugin's package)" in message
    assert "rlcore.interfaces" in message and "rlcore.engine_kit (and its submodules)" in message


def test_a_violation_reads_as_file_line_module():
    assert str(ImportViolation(Path("p/x.py"), 3, "rlcore.cli", "not part of the plugin API")) == (
        "p/x.py:3: imports rlcore.cli (not part of the plugin API)"
    )


def test_the_documented_plugin_api_is_the_checked_one():
    """docs/architecture.md's table of what a plugin may import lists PLUGIN_API, no more, no less."""
    import re

    from rlcore.testing.api import PLUGIN_API

    text = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    section = text.split("## The plugin API", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(rlcore[\w.]*)` \|", section, flags=re.MULTILINE))
    assert documented == {name.removesuffix(".*") for name in PLUGIN_API}


# Plugin tests and scripts are what a third party copies: they import the plugin API too
# (rlcore.testing has load_run_manifest, run_in_process, discover_registry, score_trajectories for
# what they reached into internals for). These imports predate the rule; the list may only shrink.
KNOWN_INTERNAL_IN_TESTS = {
    ("agent/tests/test_agent_class_tools.py", "rlcore.cli"),
    ("agent/tests/test_agent_class_tools.py", "rlcore.manifest.loader"),
    ("agent/tests/test_agent_class_tools.py", "rlcore.registry"),
    ("agent/tests/test_agent_function_tool.py", "rlcore.manifest.loader"),
    ("agent/tests/test_agent_function_tool.py", "rlcore.registry"),
    ("agent/tests/test_agent_real_model.py", "rlcore.manifest.loader"),
    ("agent/tests/test_agent_real_model.py", "rlcore.registry"),
    ("agent/tests/test_agent_real_model.py", "rlcore.trainer.driver"),
    ("agent/tests/test_agent_sandbox_isolation.py", "rlcore.registry"),
    ("agent/tests/test_agent_tool_lifecycle.py", "rlcore.registry"),
    ("agent/tests/test_agent_tool_lifecycle.py", "rlcore.trainer.scoring"),
    ("agent/tests/test_agent_tool_loop.py", "rlcore.registry"),
    ("launcher_ray/tests/test_ray_options.py", "rlcore.manifest.loader"),
    ("launcher_ray/tests/test_ray_training.py", "rlcore.checkpoint"),
    ("launcher_ray/tests/test_ray_training.py", "rlcore.cli"),
    ("launcher_slurm/tests/test_slurm_script.py", "rlcore.registry"),
    ("reward_rule/tests/test_reward_rule_plugin.py", "rlcore.manifest.loader"),
    ("reward_rule/tests/test_reward_rule_plugin.py", "rlcore.registry"),
    ("reward_rule/tests/test_reward_rule_plugin.py", "rlcore.reward_pool"),
    ("reward_rule/tests/test_reward_rule_verl_default.py", "rlcore.trainer.scoring"),
    ("rollout_hf/tests/test_rollout_hf_plugin.py", "rlcore.registry"),
    ("rollout_hf/tests/test_rollout_hf_weights.py", "rlcore.trainer.lora"),
    ("rollout_vllm/tests/test_rollout_vllm_options.py", "rlcore.trainer.lora"),
    ("rollout_vllm/tests/test_rollout_vllm_server.py", "rlcore_rollout_hf.options"),
    ("verl/tests/test_verl_cli.py", "rlcore.cli"),
    ("verl/tests/test_verl_cli.py", "rlcore.manifest.loader"),
    ("verl/tests/test_verl_cli.py", "rlcore.registry"),
}


def test_plugin_tests_and_scripts_import_only_the_plugin_api():
    found = set()
    for plugin in PLUGINS:
        files = sorted(
            f for d in ("tests", "scripts") if (plugin / d).is_dir() for f in (plugin / d).rglob("*.py")
        )
        for v in check_plugin_imports(files, own=_packages(plugin), root=ROOT):
            found.add((str(Path(v.path).relative_to("plugins")), v.module))
    new = found - KNOWN_INTERNAL_IN_TESTS
    assert not new, "plugin tests or scripts import rlcore internals (use rlcore.testing): " + ", ".join(
        f"{path} imports {module}" for path, module in sorted(new)
    )
    gone = KNOWN_INTERNAL_IN_TESTS - found
    assert not gone, f"no longer imported, remove from KNOWN_INTERNAL_IN_TESTS: {sorted(gone)}"


def test_the_in_process_helpers_of_rlcore_testing(tmp_path):
    from rlcore.testing.runs import discover_registry, load_run_manifest, run_in_process

    (tmp_path / "r.py").write_text("def score(item):\n    return 1.0\n")
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        '[model]\npath = "org/m"\n[data]\ntrain = "synthetic:addition"\n'
        '[rollout]\nsamples_per_prompt = 2\n[reward]\nfunction = "python:r.py:score"\n[trainer]\nsteps = 2\n'
    )
    resolved = load_run_manifest(manifest, ["trainer.steps=3"], environ={})
    assert (
        resolved.core.trainer.steps == 3 and resolved.component("reward.function").component.name == "python"
    )
    assert "hf" in discover_registry().components("rollout_engine")
    assert run_in_process("validate", str(manifest)) == 0
    assert run_in_process(["validate", str(tmp_path / "missing.toml")]) == 2
