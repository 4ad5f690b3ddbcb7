"""The rlcore command line: exit codes, light imports, plugins listing, schema, init."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlcore.cli import main
from rlcore.testing.runs import run_cli

ROOT = Path(__file__).resolve().parents[1]  # the repository

HEAVY = ("torch", "transformers", "vllm", "sglang", "ray", "datasets")

STARTER_OVERRIDES = ["--set", "model.path=org/model", "--set", "model.gguf_file=false"]


def _probe(*argv: str) -> list[str]:
    code = (
        f"import sys, json; from rlcore.cli import main; rc = main({list(argv)!r}); "
        f"print(json.dumps({{'rc': rc, 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_plugins_and_validate_do_not_import_heavy_modules(tmp_path):
    result = _probe("plugins", "--json")
    assert result == {"rc": 0, "heavy": []}
    manifest = tmp_path / "m.toml"
    assert main(["init", str(manifest)]) == 0
    result = _probe("validate", str(manifest))
    assert result["heavy"] == [], result


def test_plugins_json_lists_builtins_with_versions(capsys):
    assert main(["plugins", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    builtin = next(p for p in payload["plugins"] if p["name"] == "rlcore.builtin")
    assert builtin["status"] == "ok" and builtin["distribution"] == "rlcore"
    assert "local" in builtin["components"]["launcher"]


def test_invalid_manifest_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[trainer]\nsteps = 0\n")
    proc = run_cli("validate", str(bad))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stdout + proc.stderr
    assert f"{bad}:2: [trainer.steps]" in proc.stdout


def test_usage_errors_exit_2(capsys):
    assert main(["validate"]) == 2
    assert main(["frobnicate"]) == 2
    assert main([]) == 2


def test_python_dash_m_and_version():
    proc = subprocess.run([sys.executable, "-m", "rlcore", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("rlcore ")


def test_init_writes_a_manifest_that_refuses_to_be_overwritten(tmp_path, capsys):
    target = tmp_path / "r.toml"
    assert main(["init", str(target)]) == 0
    assert "[trainer]" in target.read_text()
    assert main(["init", str(target)]) == 2
    assert "--force" in capsys.readouterr().out


def test_schema_is_json_schema_with_component_options(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "rlcore manifest"
    assert "trainer" in schema["properties"]
    assert "console" in schema["properties"]["loggers"]["properties"]


@pytest.fixture(scope="module")
def thirdparty_site(tmp_path_factory):
    """The test distribution, installed by pip into its own directory (not merely imported)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(ROOT / "tests" / "fixtures" / "thirdparty"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return target


def test_a_pip_installed_third_party_plugin_is_discovered_listed_and_resolved(thirdparty_site, tmp_path):
    env = {"PYTHONPATH": str(thirdparty_site)}
    proc = run_cli("plugins", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    plugins = {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}
    demo = plugins["thirdparty_demo"]
    assert demo["distribution"] == "rlcore-thirdparty-demo" and demo["version"] == "1.2.3"
    assert demo["components"] == {"reward_function": ["demo_length"]}

    manifest = tmp_path / "m.toml"
    assert main(["init", str(manifest)]) == 0
    proc = run_cli(
        "validate",
        str(manifest),
        "--set",
        'reward.function="demo_length"',
        "--set",
        "reward.target=12",
        "--print",
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rlcore-thirdparty-demo 1.2.3" in proc.stdout
    assert "target = 12" in proc.stdout

    proc = run_cli(
        "validate",
        str(manifest),
        "--set",
        'reward.function="demo_length"',
        "--set",
        "reward.target=0",
        env=env,
    )
    assert proc.returncode == 2 and "[reward.target]" in proc.stdout

    proc = run_cli("--no-plugins", "plugins", "--json", env=env)
    assert "thirdparty_demo" not in proc.stdout


def test_a_plugin_whose_import_raises_is_listed_as_broken(tmp_path):
    pkg = tmp_path / "site"
    (pkg / "rlcore_broken_demo").mkdir(parents=True)
    (pkg / "rlcore_broken_demo" / "__init__.py").write_text("")
    (pkg / "rlcore_broken_demo" / "plugin.py").write_text(
        "raise ImportError('missing dependency: frobnitz')\n"
    )
    dist = pkg / "rlcore_broken_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rlcore-broken-demo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[rlcore]\nbroken_demo = rlcore_broken_demo.plugin\n")
    proc = run_cli("plugins", "--json", env={"PYTHONPATH": str(pkg)})
    assert proc.returncode == 0
    plugins = {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}
    assert plugins["broken_demo"]["status"] == "broken"
    assert "frobnitz" in plugins["broken_demo"]["error"]
    assert plugins["rlcore.builtin"]["status"] == "ok"
    proc = run_cli("plugins", env={"PYTHONPATH": str(pkg)})
    assert "broken" in proc.stdout and "frobnitz" in proc.stdout
    proc = run_cli("plugins", "--json", env={"PYTHONPATH": str(pkg), "RLCORE_DISABLE_PLUGINS": "broken_demo"})
    assert {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}["broken_demo"]["status"] == "disabled"


def test_init_selects_the_installed_defaults_and_names_no_plugin_itself(tmp_path, capsys, monkeypatch):
    """The starter's engine, estimator and reward are the installed components marked default;
    without plugins it says none is, and validation names each key."""
    from rlcore.registry import Registry

    registry = Registry.discover()
    target = tmp_path / "r.toml"
    assert main(["init", str(target)]) == 0
    text = target.read_text()
    for kind, key in (
        ("rollout_engine", "engine"),
        ("advantage_estimator", "advantage"),
        ("reward_function", "function"),
    ):
        defaults = [name for name, c in registry.components(kind).items() if c.default]
        assert len(defaults) == 1, (kind, defaults)
        assert f'{key} = "{defaults[0]}"' in text
    bare = tmp_path / "bare.toml"
    monkeypatch.setenv("RLCORE_NO_PLUGINS", "0")  # --no-plugins sets it to 1: put it back after the test
    assert main(["--no-plugins", "init", str(bare)]) == 0
    text = bare.read_text()
    assert "no rollout engine is installed" in text and "no advantage estimator is installed" in text
    assert "none of the installed reward functions is marked default: name one of python" in text
    capsys.readouterr()
    assert main(["--no-plugins", "validate", str(bare)]) == 2
    out = capsys.readouterr().out
    assert (
        "[rollout.engine] required key is missing" in out
        and "[algorithm.advantage] required key is missing" in out
    )
