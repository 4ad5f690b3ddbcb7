"""A run that selects a sink whose library is missing stops at start-up with one located line naming
the extra to install; a manifest naming either sink without this plugin says which package to install."""

from __future__ import annotations

import sys

import pytest
import rlcore_loggers.plugin

from rlcore.errors import ManifestError, RlcoreError
from rlcore.interfaces import BuildContext
from rlcore.testing import isolated_registry, require_plugins
from rlcore.testing.runs import registry_with, run_in_process, write_run_manifest

# The tiny run's engine, advantage estimator and reward.
TINY_RUN_PLUGINS = ("rlcore_rollout_hf", "rlcore_algo_grpo", "rlcore_reward_rule")


def _sink(name):
    return registry_with(rlcore_loggers.plugin, "loggers", "rlcore-loggers").get("metrics_sink", name)


@pytest.mark.parametrize(
    "name, hidden",
    [
        ("tensorboard", "torch.utils.tensorboard"),
        ("wandb", "wandb"),
    ],
)
def test_a_missing_library_names_the_extra(tmp_path, monkeypatch, name, hidden):
    monkeypatch.setitem(sys.modules, hidden, None)  # importing it now fails as if it were not installed
    with pytest.raises(RlcoreError) as caught:
        _sink(name).build({}, BuildContext(run_dir=str(tmp_path)))
    message = str(caught.value)
    assert message.startswith(f'[trainer] loggers: the "{name}" metrics sink needs the ')
    assert message.endswith(f'pip install "rlcore-loggers[{name}]"') and "\n" not in message


@pytest.mark.slow
def test_a_run_selecting_wandb_without_it_stops_with_one_line(tmp_path, tiny_model, monkeypatch, capsys):
    require_plugins(*TINY_RUN_PLUGINS)
    monkeypatch.setitem(sys.modules, "wandb", None)
    manifest = write_run_manifest(tmp_path, tiny_model, trainer={"steps": 1, "loggers": ["jsonl", "wandb"]})
    assert run_in_process("run", manifest, "--run-dir", tmp_path / "run") != 0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert 'the "wandb" metrics sink needs the wandb package' in out
    assert 'pip install "rlcore-loggers[wandb]"' in out
    assert "Traceback" not in out
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.exists() or "critic/score/mean" not in metrics.read_text()  # stopped before a step


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_a_manifest_naming_a_sink_without_the_plugin_says_what_to_install(tmp_path, name):
    manifest = write_run_manifest(tmp_path, tmp_path, trainer={"loggers": ["console", name]})
    from rlcore.testing.runs import load_run_manifest

    with pytest.raises(ManifestError) as caught:
        load_run_manifest(manifest, registry=isolated_registry())  # rlcore's builtins alone
    message = str(caught.value)
    assert "trainer.loggers" in message and "rlcore-loggers" in message
