"""Manifest loading: located errors for malformed manifests, overrides, resolution."""

from __future__ import annotations

import pytest

from rlcore.errors import ManifestError
from rlcore.manifest.loader import load_manifest

VALID = """\
[run]
name = "t"

[model]
path = "org/model"

[data]
train = "synthetic:addition"

[rollout]
engine = "toy"
samples_per_prompt = 2

[reward]
function = "match"

[algorithm]
advantage = "group"
policy_loss = "clipped"

[trainer]
steps = 3
"""


def _replace(old: str, new: str) -> str:
    assert old in VALID, old
    return VALID.replace(old, new)


# (id, manifest text, dotted key the error must name (or "" for document-level), a text whose last
#  occurrence marks the line the error must point at (None: no line), a phrase the message must contain)
MALFORMED = [
    ("toml-syntax", VALID + "\n[trainer\n", "", "[trainer", "invalid TOML"),
    ("toml-bad-value", _replace("steps = 3", "steps = three"), "", "steps = three", "invalid TOML"),
    (
        "toml-duplicate-key",
        _replace("steps = 3", "steps = 3\nsteps = 4"),
        "trainer.steps",
        "steps = 4",
        "duplicate key 'steps' in table [trainer] (first set on line",
    ),
    (
        "toml-duplicate-top-level-key",
        "seed = 1\nseed = 2\n" + VALID,
        "seed",
        "seed = 2",
        "duplicate key 'seed' in the top level",
    ),
    (
        "toml-duplicate-dotted-key",
        _replace('path = "org/model"', 'path = "org/model"\nlora.rank = 4\nlora.rank = 8'),
        "model.lora.rank",
        "lora.rank = 8",
        "duplicate key 'lora.rank' in table [model]",
    ),
    (
        "toml-duplicate-table",
        VALID + "\n[trainer]\nlr = 1.0\n",
        "trainer",
        "[trainer]",
        "table [trainer] is declared twice (first on line",
    ),
    ("toml-unclosed-string", _replace('name = "t"', 'name = "t'), "", 'name = "t', "invalid TOML"),
    ("unknown-table", VALID + "\n[optimizer]\nlr = 1\n", "optimizer", "[optimizer]", "unknown key"),
    (
        "unknown-key-run",
        _replace('name = "t"', 'name = "t"\nseeed = 3'),
        "run.seeed",
        "seeed",
        "did you mean 'seed'",
    ),
    (
        "unknown-key-trainer",
        _replace("steps = 3", "steps = 3\nlearning_rate = 1e-5"),
        "trainer.learning_rate",
        "learning_rate",
        "Expected one of",
    ),
    (
        "unknown-key-model",
        _replace('path = "org/model"', 'path = "org/model"\ndtyp = "float32"'),
        "model.dtyp",
        "dtyp =",
        "did you mean 'dtype'",
    ),
    (
        "unknown-key-data",
        _replace('train = "synthetic:addition"', 'train = "synthetic:addition"\nbatch = 3'),
        "data.batch",
        "batch = 3",
        "unknown key",
    ),
    (
        "unknown-lora-key",
        VALID + "\n[model.lora]\nrank = 4\nalpah = 8\n",
        "model.lora.alpah",
        "alpah",
        "did you mean 'alpha'",
    ),
    (
        "wrong-type-steps",
        _replace("steps = 3", 'steps = "3 steps"'),
        "trainer.steps",
        "steps =",
        "valid integer",
    ),
    (
        "wrong-type-seed",
        _replace('name = "t"', 'name = "t"\nseed = 1.5'),
        "run.seed",
        "seed = 1.5",
        "integer",
    ),
    (
        "wrong-type-loggers",
        _replace("steps = 3", 'steps = 3\nloggers = "console"'),
        "trainer.loggers",
        "loggers =",
        "list",
    ),
    (
        "wrong-type-table",
        VALID.replace('[run]\nname = "t"\n', "run = 3\n"),
        "run",
        "run = 3",
        "expected a table",
    ),
    (
        "out-of-range-steps",
        _replace("steps = 3", "steps = 0"),
        "trainer.steps",
        "steps = 0",
        "greater than or equal to 1",
    ),
    (
        "out-of-range-lr",
        _replace("steps = 3", "steps = 3\nlr = -1.0"),
        "trainer.lr",
        "lr = -1.0",
        "greater than 0",
    ),
    (
        "out-of-range-temperature",
        _replace("samples_per_prompt = 2", "samples_per_prompt = 2\ntemperature = -0.5"),
        "rollout.temperature",
        "temperature",
        "greater than or equal to 0",
    ),
    (
        "out-of-range-top-p",
        _replace("samples_per_prompt = 2", "samples_per_prompt = 2\ntop_p = 1.5"),
        "rollout.top_p",
        "top_p",
        "less than or equal to 1",
    ),
    (
        "out-of-range-max-response",
        _replace('train = "synthetic:addition"', 'train = "synthetic:addition"\nmax_response_tokens = 0'),
        "data.max_response_tokens",
        "max_response_tokens",
        "greater than or equal to 1",
    ),
    (
        "bad-literal-dtype",
        _replace('path = "org/model"', 'path = "org/model"\ndtype = "fp8"'),
        "model.dtype",
        'dtype = "fp8"',
        "float32",
    ),
    (
        "bad-literal-agg",
        _replace('policy_loss = "clipped"', 'policy_loss = "clipped"\nloss_agg_mode = "mean"'),
        "algorithm.loss_agg_mode",
        "loss_agg_mode",
        "token-mean",
    ),
    (
        "retired-tis-cap",
        _replace('policy_loss = "clipped"', 'policy_loss = "clipped"\ntis_cap = 2.0'),
        "algorithm.tis_cap",
        "tis_cap",
        'rollout_correction = "token_truncate" with rollout_is_threshold = C',
    ),
    (
        "unknown-engine",
        _replace('engine = "toy"', 'engine = "tyo"'),
        "rollout.engine",
        "engine =",
        "did you mean 'toy'",
    ),
    (
        "unknown-first-party-engine",
        _replace('engine = "toy"', 'engine = "sglang"'),
        "rollout.engine",
        "engine =",
        "pip install rlcore-rollout-sglang",
    ),
    (
        "unknown-reward",
        _replace('function = "match"', 'function = "mtch"'),
        "reward.function",
        "function =",
        "did you mean 'match'",
    ),
    (
        "unknown-estimator",
        _replace('advantage = "group"', 'advantage = "gruop"'),
        "algorithm.advantage",
        "advantage =",
        "available",
    ),
    (
        "unknown-loss",
        _replace('policy_loss = "clipped"', 'policy_loss = "ppo"'),
        "algorithm.policy_loss",
        "policy_loss =",
        "available",
    ),
    (
        "unknown-launcher",
        VALID + '\n[launcher]\nname = "kubernetes"\n',
        "launcher.name",
        "kubernetes",
        "available: local",
    ),
    (
        "unknown-logger",
        _replace("steps = 3", 'steps = 3\nloggers = ["console", "mlflow"]'),
        "trainer.loggers",
        "mlflow",
        "metrics sink 'mlflow'",
    ),
    (
        "option-of-another-component",
        _replace("samples_per_prompt = 2", "samples_per_prompt = 2\ngpu_memory_utilization = 0.5"),
        "rollout.gpu_memory_utilization",
        "gpu_memory_utilization",
        "option of rollout engine 'gpu_toy'",
    ),
    (
        "core-key-typo-rollout",
        _replace("samples_per_prompt = 2", "samples_per_prompt = 2\ntemprature = 0.7"),
        "rollout.temprature",
        "temprature",
        "did you mean 'temperature'? [rollout] takes engine, ",
    ),
    (
        "core-key-typo-lists-both",
        _replace("samples_per_prompt = 2", "samples_per_prompt = 2\ntemprature = 0.7"),
        "rollout.temprature",
        "temprature",
        "; rollout engine 'toy' takes speed",
    ),
    (
        "option-unknown-to-component",
        _replace("samples_per_prompt = 2", "samples_per_prompt = 2\nsped = 3"),
        "rollout.sped",
        "sped",
        "did you mean 'speed'",
    ),
    (
        "component-option-out-of-range",
        _replace("samples_per_prompt = 2", "samples_per_prompt = 2\nspeed = 50"),
        "rollout.speed",
        "speed = 50",
        "less than or equal to 10",
    ),
    (
        "component-option-wrong-type",
        _replace('function = "match"', 'function = "match"\nthreshold = "high"'),
        "reward.threshold",
        "threshold",
        "valid number",
    ),
    (
        "component-option-pattern",
        _replace('function = "match"', 'function = "match"\nmode = "lenient"'),
        "reward.mode",
        "lenient",
        "pattern",
    ),
    (
        "algorithm-option-of-neither",
        _replace('policy_loss = "clipped"', 'policy_loss = "clipped"\nclip_ration = 0.3'),
        "algorithm.clip_ration",
        "clip_ration",
        "did you mean 'clip_ratio'",
    ),
    (
        "missing-model",
        VALID.replace('[model]\npath = "org/model"\n', ""),
        "model",
        None,
        "required table is missing: add [model] with path = ...",
    ),
    (
        "missing-model-path",
        _replace('path = "org/model"', 'dtype = "float32"'),
        "model.path",
        "[model]",
        "required key is missing",
    ),
    (
        "missing-reward-function",
        _replace('function = "match"', "timeout_s = 3.0"),
        "reward.function",
        "[reward]",
        "required key is missing",
    ),
    (
        "missing-trainer-steps",
        _replace("steps = 3", "lr = 1e-5"),
        "trainer.steps",
        "[trainer]",
        "required key is missing",
    ),
    (
        "missing-data",
        VALID.replace('[data]\ntrain = "synthetic:addition"\n', ""),
        "data",
        None,
        "required table is missing: add [data] with train = ...",
    ),
    (
        "logger-options-not-enabled",
        _replace("steps = 3", 'steps = 3\nloggers = ["console"]')
        + '\n[loggers.jsonl]\nfilename = "m.jsonl"\n',
        "loggers.jsonl",
        "[loggers.jsonl]",
        "does not enable it",
    ),
    (
        "logger-option-unknown",
        _replace("steps = 3", 'steps = 3\nloggers = ["jsonl"]') + '\n[loggers.jsonl]\nfile = "m.jsonl"\n',
        "loggers.jsonl.file",
        "file =",
        "did you mean 'filename'",
    ),
    (
        "python-reward-missing-file",
        _replace('function = "match"', 'function = "python:nope.py:score"'),
        "reward.function",
        "function =",
        "does not exist",
    ),
    (
        "python-reward-bad-target",
        _replace('function = "match"', 'function = "python:score"'),
        "reward.function",
        "function =",
        "python:FILE.py:FUNCTION",
    ),
    (
        "missing-local-model-dir",
        _replace('path = "org/model"', 'path = "./no/such/model"'),
        "model.path",
        "path =",
        "does not exist",
    ),
    (
        "uninstalled-package-model",
        _replace('path = "org/model"', 'path = "package:no_such_package_xyz"'),
        "model.path",
        "path =",
        "not installed",
    ),
]


def _line_of(text: str, marker: str) -> int:
    return max(i for i, line in enumerate(text.splitlines(), start=1) if marker in line)


@pytest.mark.parametrize("case_id, text, key, marker, phrase", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_manifests_give_located_errors(tmp_path, toy_registry, case_id, text, key, marker, phrase):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ManifestError) as info:
        load_manifest(path, registry=toy_registry, environ={})
    problems = info.value.problems
    matching = [p for p in problems if p.key == key]
    assert matching, f"no problem names {key!r}: {problems}"
    problem = matching[0]
    assert problem.file == str(path)
    if marker is not None:
        assert problem.line == _line_of(text, marker), str(problem)
    assert phrase in problem.message, problem.message
    assert str(path) in str(info.value)


def test_at_least_thirty_malformed_cases():
    assert len(MALFORMED) >= 30


def test_all_problems_are_reported_together(tmp_path, toy_registry):
    text = _replace("steps = 3", "steps = 0\nbogus = 1").replace('engine = "toy"', 'engine = "nope"')
    path = tmp_path / "many.toml"
    path.write_text(text)
    with pytest.raises(ManifestError) as info:
        load_manifest(path, registry=toy_registry, environ={})
    keys = {p.key for p in info.value.problems}
    assert {"trainer.steps", "trainer.bogus", "rollout.engine"} <= keys


def test_valid_manifest_resolves_components_and_options(tmp_path, toy_registry):
    path = tmp_path / "ok.toml"
    path.write_text(
        _replace("samples_per_prompt = 2", "samples_per_prompt = 2\nspeed = 4").replace(
            'policy_loss = "clipped"', 'policy_loss = "clipped"\nclip_ratio = 0.3\nnorm_by_std = false'
        )
    )
    manifest = load_manifest(path, registry=toy_registry, environ={})
    assert manifest.component("rollout.engine").options.speed == 4
    assert manifest.component("algorithm.policy_loss").options.clip_ratio == 0.3
    assert manifest.component("algorithm.advantage").options.norm_by_std is False
    resolved = manifest.resolved_dict()
    assert resolved["rollout"]["speed"] == 4
    assert resolved["plugins"]["rollout.engine"] == {
        "name": "toy",
        "distribution": "rlcore-toy",
        "version": "9.9",
    }
    assert manifest.versions()["rlcore-toy"] == "9.9"


def test_command_line_overrides_win_over_environment_and_file(tmp_path, toy_registry):
    path = tmp_path / "ok.toml"
    path.write_text(VALID)
    env = {"RLCORE_ROLLOUT__TEMPERATURE": "0.5", "RLCORE_TRAINER__STEPS": "7"}
    manifest = load_manifest(
        path,
        ["rollout.temperature=0.7", "rollout.speed=3", 'run.name="x y"'],
        registry=toy_registry,
        environ=env,
    )
    assert manifest.core.rollout.temperature == 0.7
    assert manifest.core.trainer.steps == 7
    assert manifest.core.run.name == "x y"
    assert manifest.component("rollout.engine").options.speed == 3


def test_bad_overrides_are_located_as_overrides(tmp_path, toy_registry):
    path = tmp_path / "ok.toml"
    path.write_text(VALID)
    with pytest.raises(ManifestError) as info:
        load_manifest(path, ["trainer.steps=-2"], registry=toy_registry, environ={})
    assert "from an override" in info.value.problems[0].message
    with pytest.raises(ManifestError) as info:
        load_manifest(path, ["no-equals-sign"], registry=toy_registry, environ={})
    assert "--set expects" in str(info.value)


def test_missing_file(tmp_path, toy_registry):
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path / "nope.toml", registry=toy_registry, environ={})
    assert "no such manifest file" in str(info.value)


def test_package_paths_and_relative_paths_resolve(tmp_path, toy_registry):
    (tmp_path / "model").mkdir()
    path = tmp_path / "ok.toml"
    path.write_text(
        _replace('path = "org/model"', 'path = "model"').replace(
            'train = "synthetic:addition"', 'train = "synthetic:addition"\nval = "package:pytest"'
        )
    )
    manifest = load_manifest(path, registry=toy_registry, environ={})
    assert manifest.core.model.path == str((tmp_path / "model").resolve())
    assert manifest.core.data.val.endswith("pytest")
    assert manifest.core.run.output_dir == str((tmp_path / "runs").resolve())


def test_group_estimator_with_one_sample_is_rejected(tmp_path, toy_registry):
    from rlcore.manifest.checks import check_resolved

    path = tmp_path / "one.toml"
    text = _replace("samples_per_prompt = 2", "samples_per_prompt = 1")
    path.write_text(text)
    manifest = load_manifest(path, registry=toy_registry, environ={})
    with pytest.raises(ManifestError) as info:
        check_resolved(manifest)
    problem = info.value.problems[0]
    assert problem.key == "rollout.samples_per_prompt" and problem.line == _line_of(
        text, "samples_per_prompt"
    )
    assert "every advantage would be zero" in problem.message


def test_an_option_of_other_components_names_every_one_that_declares_it(tmp_path, toy_registry):
    import rlcore
    from rlcore.components import Component, Options

    class GpuEngineOptions(Options):
        gpu_memory_utilization: float = 0.5

    class MoreEngines:
        @rlcore.hookimpl
        def rlcore_rollout_engines(self):
            return [
                Component("gpu_other", "builtins:dict", GpuEngineOptions, "another engine with GPU options")
            ]

    toy_registry.register(MoreEngines(), name="more", distribution="rlcore-more", version="1.0")
    path = tmp_path / "m.toml"
    path.write_text(
        _replace("samples_per_prompt = 2", "samples_per_prompt = 2\ngpu_memory_utilization = 0.5")
    )
    with pytest.raises(ManifestError) as info:
        load_manifest(path, registry=toy_registry, environ={})
    message = info.value.problems[0].message
    assert (
        "'gpu_memory_utilization' is an option of rollout engines 'gpu_other' and 'gpu_toy', not of the selected one"
        in message
    )


@pytest.mark.parametrize(
    "variable, value, key",
    [
        ("RLCORE_TRAINER__STEPS", "0", "trainer.steps"),
        ("rlcore_trainer__Steps", "-1", "trainer.steps"),  # as the environment spells it
        ("RLCORE_TRAINER", '{"steps": 0}', "trainer.steps"),
        ("RLCORE_TRAINER__STEPS__X", "1", "trainer.steps"),
        ("RLCORE_ROLLOUT__SPED", "3", "rollout.sped"),
    ],
)
def test_an_environment_override_error_names_the_variable(tmp_path, toy_registry, variable, value, key):
    path = tmp_path / "ok.toml"
    path.write_text(VALID)
    with pytest.raises(ManifestError) as info:
        load_manifest(path, registry=toy_registry, environ={variable: value, "RLCORE_LOG_LEVEL": "INFO"})
    problem = next(p for p in info.value.problems if p.key == key)
    assert f"(from an override: the environment variable {variable})" in problem.message
    assert problem.line is None


def test_an_environment_variable_that_is_not_a_table_is_a_located_error(tmp_path, toy_registry):
    path = tmp_path / "ok.toml"
    path.write_text(VALID)
    with pytest.raises(ManifestError) as info:
        load_manifest(path, registry=toy_registry, environ={"RLCORE_TRAINER": "3"})
    problem = info.value.problems[0]
    assert problem.key == "trainer" and problem.file == "<environment>"
    assert "the environment variable RLCORE_TRAINER must hold a JSON object" in problem.message


def test_the_command_line_override_is_named_over_the_environment(tmp_path, toy_registry):
    path = tmp_path / "ok.toml"
    path.write_text(VALID)
    with pytest.raises(ManifestError) as info:
        load_manifest(
            path, ["trainer.steps=-2"], registry=toy_registry, environ={"RLCORE_TRAINER__STEPS": "0"}
        )
    assert "(from an override: --set trainer.steps=-2)" in info.value.problems[0].message


def test_a_left_out_selector_takes_the_installed_default_and_the_core_names_none(tmp_path, toy_registry):
    from rlcore.manifest.schema import AlgorithmTable, RolloutTable
    from rlcore.registry import Registry

    assert (
        RolloutTable.model_fields["engine"].default is None
        and AlgorithmTable.model_fields["advantage"].default is None
    )
    path = tmp_path / "m.toml"
    path.write_text(VALID.replace('engine = "toy"\n', "").replace('advantage = "group"\n', ""))
    with pytest.raises(ManifestError) as info:
        load_manifest(path, registry=toy_registry, environ={})
    problems = {p.key: p.message for p in info.value.problems}
    assert (
        "no installed rollout engine is marked default (installed: gpu_toy, toy)"
        in problems["rollout.engine"]
    )
    assert "no installed advantage estimator is marked default" in problems["algorithm.advantage"]
    # The installed first-party plugins mark theirs: the hf engine and the grpo estimator.
    path.write_text(
        VALID.replace('engine = "toy"\n', "")
        .replace('advantage = "group"\n', "")
        .replace('function = "match"', 'function = "python:r.py:score"')
        .replace('policy_loss = "clipped"', "")
    )
    (tmp_path / "r.py").write_text("def score(item):\n    return 0.0\n")
    manifest = load_manifest(path, registry=Registry.discover(), environ={})
    assert manifest.component("rollout.engine").component.name == "hf"
    assert manifest.component("algorithm.advantage").component.name == "grpo"
    assert manifest.resolved_dict()["rollout"]["engine"] == "hf"
