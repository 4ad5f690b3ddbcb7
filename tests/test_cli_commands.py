"""Sub-commands registered through the ``rlcore_commands`` hook (rlcore's own ``data`` and ``eval``
among them; ``serve`` from the rlcore-serve plugin), and ``rlcore plugins --verbose``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import rlcore
from rlcore.cli import main
from rlcore.components import Command, Component
from rlcore.data.io import read_rows
from rlcore.registry import Registry, target_path
from rlcore.testing.runs import run_cli

HEAVY = ("torch", "transformers", "vllm", "sglang", "ray", "datasets")


@pytest.fixture(autouse=True)
def _plugins_on(monkeypatch):
    """main() sets RLCORE_NO_PLUGINS=1 for --no-plugins (for the processes a run starts); undo it."""
    # setenv (not delenv, which records nothing for an unset variable) so that teardown removes it.
    monkeypatch.setenv("RLCORE_NO_PLUGINS", "")
    monkeypatch.setenv("RLCORE_DISABLE_PLUGINS", "")


@pytest.fixture
def extra_plugin(monkeypatch):
    """Registers a plugin object in every registry main() discovers."""
    plugins = []
    discover = Registry.discover.__func__

    def discover_with_extra(cls, **kwargs):
        registry = discover(cls, **kwargs)
        for plugin, name, distribution in plugins:
            registry.register(plugin, name=name, distribution=distribution, version="0.0.test")
        return registry

    monkeypatch.setattr(Registry, "discover", classmethod(discover_with_extra))
    return lambda plugin, name, distribution: plugins.append((plugin, name, distribution))


def _commands_plugin(*commands: Command):
    class Plugin:
        @rlcore.hookimpl
        def rlcore_commands(self):
            return list(commands)

    return Plugin()


# ----------------------------------------------------------------------------- data and eval


def test_data_and_eval_are_registered_through_the_hook_by_name_only():
    registry = Registry.discover(external=False, disabled=[])
    commands = {c.name: c for c in registry.commands()}
    assert (
        commands["data"].configure == "rlcore.data.cli:configure"
        and commands["data"].run == "rlcore.data.cli:run"
    )
    assert commands["eval"].run == "rlcore.evaluation:run"
    for command in commands.values():
        assert command.distribution == "rlcore" and command.plugin == "rlcore.builtin"
    assert "serve" not in commands  # the rlcore-serve plugin's


def test_help_lists_data_and_eval_without_importing_their_modules():
    code = (
        "import sys, json; from rlcore.cli import main; rc = main(['--no-plugins', '--help']); "
        "print(json.dumps({'rc': rc, 'loaded': [m for m in ('rlcore.data.cli', 'rlcore.evaluation') if m in sys.modules],"
        f" 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = out.stdout.strip().splitlines()
    assert json.loads(lines[-1]) == {"rc": 0, "loaded": [], "heavy": []}
    text = "\n".join(lines[:-1])
    assert "data" in text and "prepare datasets" in text and "eval" in text


def test_rlcore_data_works_through_main(tmp_path, capsys):
    out = tmp_path / "add.parquet"
    argv = ["data", "synthetic", "--task", "addition", "--size", "5", "--seed", "1", "--output", str(out)]
    assert main(["--no-plugins", *argv]) == 0
    assert len(read_rows(out)) == 5
    assert main(argv) == 0  # with the installed plugins too
    assert main(["data"]) == 2  # a data sub-command is required
    assert main(["data", "synthetic", "--task", "addition", "--output", str(out), "--bogus"]) == 2


# ----------------------------------------------------------------------------- first-party plugins' commands


def test_a_plugin_command_without_its_plugin_names_the_package_to_install(monkeypatch, capsys):
    from rlcore import cli

    monkeypatch.setitem(cli.PLUGIN_COMMANDS, "frobnicate", "rlcore-frobnicator-not-installed")
    assert main(["frobnicate", "run.toml", "--port", "3"]) == 2
    out = capsys.readouterr().out
    assert out.strip().splitlines() == [
        "error: rlcore frobnicate: the command comes with the rlcore-frobnicator-not-installed plugin, which is not "
        "installed: pip install rlcore-frobnicator-not-installed"
    ], out
    assert "Traceback" not in out and "invalid choice" not in out


def test_a_plugin_command_with_plugins_off_says_so(capsys):
    pytest.importorskip("rlcore_serve")
    assert main(["--no-plugins", "serve", "run.toml"]) == 2
    out = capsys.readouterr().out
    assert (
        "rlcore serve: the command comes with the rlcore-serve plugin, which is installed but turned off"
        in out
    )


def test_a_plugin_command_whose_plugin_is_installed_runs_as_usual(capsys):
    pytest.importorskip("rlcore_serve")
    assert main(["serve", "--help"]) == 0
    assert "--model-name" in capsys.readouterr().out


def test_the_plugin_commands_table_names_the_distributions_that_register_them():
    """Each distribution in PLUGIN_COMMANDS, where installed, registers that command, and every
    command of an installed first-party plugin (plugins/*) is in the table."""
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    from rlcore.cli import PLUGIN_COMMANDS

    registry = Registry.discover(disabled=[])
    by_name = {c.name: c for c in registry.commands()}
    checked = 0
    for name, distribution in PLUGIN_COMMANDS.items():
        try:
            version(distribution)
        except PackageNotFoundError:
            continue
        assert name in by_name and by_name[name].distribution == distribution, (name, distribution)
        checked += 1
    assert checked >= 1
    plugins = Path(__file__).resolve().parents[1] / "plugins"
    first_party = {
        line.split('"')[1]
        for p in plugins.glob("*/pyproject.toml")
        for line in p.read_text().splitlines()
        if line.startswith("name = ")
    }
    for command in by_name.values():
        if command.distribution in first_party:
            assert PLUGIN_COMMANDS.get(command.name) == command.distribution, (
                f"rlcore {command.name} (from {command.distribution}) is missing from rlcore.cli.PLUGIN_COMMANDS"
            )


def test_core_commands_win_over_a_plugin_command_of_the_same_name(extra_plugin, tmp_path, capsys):
    extra_plugin(
        _commands_plugin(Command("data", "impostor", run=lambda args: 99)), "impostor", "rlcore-impostor"
    )
    out = tmp_path / "a.parquet"
    assert main(["data", "synthetic", "--task", "addition", "--size", "2", "--output", str(out)]) == 0


# ----------------------------------------------------------------------------- string configure, failures


def test_a_string_configure_is_imported_only_when_its_command_runs(
    extra_plugin, tmp_path, monkeypatch, capsys
):
    module = tmp_path / "rlcore_lazy_demo_cli.py"
    module.write_text(
        "def configure(parser):\n    parser.add_argument('--flag', default='unset')\n\n"
        "def run(args):\n    print('flag=' + args.flag)\n    return 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rlcore_lazy_demo_cli", raising=False)
    extra_plugin(
        _commands_plugin(
            Command(
                "lazy", "a demo", configure="rlcore_lazy_demo_cli:configure", run="rlcore_lazy_demo_cli:run"
            )
        ),
        "lazy_demo",
        "rlcore-lazy-demo",
    )
    assert (
        main(
            [
                "data",
                "synthetic",
                "--task",
                "addition",
                "--size",
                "1",
                "--output",
                str(tmp_path / "a.parquet"),
            ]
        )
        == 0
    )
    assert main(["--help"]) == 0
    assert "rlcore_lazy_demo_cli" not in sys.modules
    assert main(["lazy", "--flag", "on"]) == 3
    assert "flag=on" in capsys.readouterr().out


def test_a_command_whose_module_fails_to_import_reports_it_when_run(extra_plugin, tmp_path, capsys):
    extra_plugin(
        _commands_plugin(
            Command(
                "zap",
                "broken configure",
                configure="rlcore_no_such_module.cli:configure",
                run="rlcore_no_such_module.cli:run",
            ),
            Command("zip", "broken run", run="rlcore_no_such_module.cli:run"),
        ),
        "zapper",
        "rlcore-zapper",
    )
    capsys.readouterr()
    for argv in (["zap"], ["zap", "--port", "3", "x.toml"], ["zip"]):
        assert main(argv) == 1, argv
        out = capsys.readouterr().out
        assert "Traceback" not in out
        assert f"the {argv[0]!r} command (from rlcore-zapper) is unavailable" in out, out
        assert "rlcore_no_such_module" in out
    # The rest of the command line keeps working.
    assert main(["--help"]) == 0 and "zap" in capsys.readouterr().out
    assert (
        main(
            [
                "data",
                "synthetic",
                "--task",
                "addition",
                "--size",
                "1",
                "--output",
                str(tmp_path / "a.parquet"),
            ]
        )
        == 0
    )
    assert main(["zap", "--help"]) == 0


def test_command_records_are_checked():
    with pytest.raises(TypeError, match="run"):
        Command("x", "h", run="no_colon")
    with pytest.raises(TypeError, match="configure"):
        Command("x", "h", run="m:f", configure="no_colon")
    with pytest.raises(TypeError, match="name"):
        Command("", "h", run="m:f")


# ----------------------------------------------------------------------------- plugins --verbose


def test_plugins_verbose_json_shows_each_factory_and_command(capsys):
    assert main(["plugins", "--json", "--verbose"]) == 0
    plugins = {p["name"]: p for p in json.loads(capsys.readouterr().out)["plugins"]}
    builtin = plugins["rlcore.builtin"]
    assert builtin["factories"]["policy_loss"] == {"ppo_clip": "rlcore.algorithms.losses:build_ppo_clip"}
    assert builtin["factories"]["metrics_sink"] == {
        "console": "rlcore.builtin.loggers:console",
        "jsonl": "rlcore.builtin.loggers:jsonl",
    }
    assert {name: builtin["commands"].get(name) for name in ("data", "plot")} == {
        "data": "rlcore.data.cli:run",
        "plot": "rlcore.plotting:run",
    }
    if "serve" in plugins:
        assert plugins["serve"]["commands"] == {"serve": "rlcore_serve.cli:run"}
    assert (
        plugins["algo_grpo"]["factories"]["advantage_estimator"]["grpo"]
        == "rlcore_algo_grpo.estimators:build_grpo"
    )
    for plugin in plugins.values():  # one factory per listed component
        assert {k: sorted(v) for k, v in plugin["factories"].items()} == {
            k: sorted(v) for k, v in plugin["components"].items()
        }
    # Without --verbose the JSON is as before.
    assert main(["plugins", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["plugins"][0]
    assert "factories" not in plain and "commands" not in plain


def test_plugins_verbose_table_names_the_code():
    proc = run_cli("plugins", "--verbose", env={"COLUMNS": "250"})
    assert proc.returncode == 0, proc.stderr
    for text in (
        "rlcore.algorithms.losses:build_ppo_clip",
        "rlcore_rollout_hf.engine:build",
        "rlcore.data.cli:run",
    ):
        assert text in proc.stdout


def test_plugins_verbose_does_not_import_heavy_modules():
    code = (
        "import sys, json; from rlcore.cli import main; rc = main(['plugins', '--verbose', '--json']); "
        f"print(json.dumps({{'rc': rc, 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"rc": 0, "heavy": []}


def _module_level_factory(options, context):
    return None


def test_a_callable_factory_is_shown_as_module_and_qualname(rlcore_registry, rlcore_register):
    class Plugin:
        @rlcore.hookimpl
        def rlcore_reward_functions(self):
            return [Component("callable_reward", _module_level_factory)]

    rlcore_register(Plugin(), name="callables")
    info = next(i for i in rlcore_registry.plugin_infos() if i.name == "callables")
    assert info.factories == {"reward_function": {"callable_reward": f"{__name__}:_module_level_factory"}}
    assert target_path("pkg.mod:attr") == "pkg.mod:attr"
    assert target_path(Registry.discover) == "rlcore.registry:Registry.discover"
