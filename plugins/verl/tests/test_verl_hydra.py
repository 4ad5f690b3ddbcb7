"""Hydra's override words and values, as verl's command lines use them."""

from __future__ import annotations

import pytest
from rlcore_verl.hydra import Override, OverrideError, flatten, parse_override, parse_value, read_yaml_config


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e-6", 1e-6),
        ("0.80", 0.8),
        ("-1", -1),
        ("1_000", 1000),
        ("True", True),
        ("false", False),
        ("null", None),
        ("vllm", "vllm"),
        ("'error'", "error"),
        ('"a b"', "a b"),
        ("", ""),
        ('["console","wandb"]', ["console", "wandb"]),
        ("['/a/x.parquet', '/b/y.parquet']", ["/a/x.parquet", "/b/y.parquet"]),
        ("[]", []),
        ("{max_position_embeddings: 32768}", {"max_position_embeddings": 32768}),
        ("{a: [1, 2], 'b': x}", {"a": [1, 2], "b": "x"}),
        ("${oc.select:a.b,1}", "${oc.select:a.b,1}"),
        ("all-linear", "all-linear"),
        ("[q_proj,v_proj]", ["q_proj", "v_proj"]),
    ],
)
def test_values(text, value):
    assert parse_value(text) == value


@pytest.mark.parametrize(
    ("word", "override"),
    [
        ("data.train_batch_size=1024", Override("data.train_batch_size", 1024, "set", "cl")),
        (
            "+actor_rollout_ref.model.override_config.max_position_embeddings=32768",
            Override("actor_rollout_ref.model.override_config.max_position_embeddings", 32768, "add", "cl"),
        ),
        ("++trainer.nnodes=2", Override("trainer.nnodes", 2, "force", "cl")),
        ("~trainer.logger", Override("trainer.logger", None, "delete", "cl")),
    ],
)
def test_overrides(word, override):
    assert parse_override(word, "cl") == override


@pytest.mark.parametrize(
    ("word", "message"),
    [
        ("trainer.nnodes", "has no '='"),
        ("not a key=1", "is not a Hydra override"),
        ("trainer.save_freq=5,10", "a sweep over several values"),
        ("trainer.save_freq=choice(5,10)", "a Hydra sweep function"),
        ("trainer.logger=[console", "expected ',' or ']'"),
        ("trainer.project_name='open", "is never closed"),
    ],
)
def test_bad_words_are_refused_naming_where_they_came_from(word, message):
    with pytest.raises(OverrideError) as info:
        parse_override(word, "run.sh:12")
    assert str(info.value).startswith("run.sh:12: ") and message in str(info.value)


def test_yaml_configs_are_flattened_with_their_defaults_list_kept(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "defaults:\n  - ppo_trainer\n  - _self_\ndata:\n  train_batch_size: 64\n"
        "actor_rollout_ref:\n  rollout:\n    engine_kwargs:\n      vllm: {}\n"
    )
    assert read_yaml_config(path) == {
        "data.train_batch_size": 64,
        "actor_rollout_ref.rollout.engine_kwargs.vllm": {},
        "defaults": ["ppo_trainer", "_self_"],
    }
    assert flatten({"a": {"b": {"c": 1}, "d": {}}}) == {"a.b.c": 1, "a.d": {}}


def test_bad_yaml_is_located(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("data:\n  train_batch_size: [1,\n")
    with pytest.raises(Exception) as info:
        read_yaml_config(path)
    assert f"{path}:" in str(info.value) and "not valid YAML" in str(info.value)
