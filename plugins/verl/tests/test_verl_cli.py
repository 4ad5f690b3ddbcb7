"""``rlcore from-verl`` end to end: verl launch scripts in the style of verl's examples (tests/scripts/,
written for these tests) become manifests that ``rlcore validate`` accepts once their files exist."""

from __future__ import annotations

import io
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from rlcore.cli import main
from rlcore.testing import require_plugins

SCRIPTS = Path(__file__).parent / "scripts"
TARGETS = (
    "rlcore_rollout_vllm",
    "rlcore_rollout_sglang",
    "rlcore_reward_rule",
    "rlcore_algo_grpo",
    "rlcore_algo_ppo",
    "rlcore_launcher_ray",
)


def _one_row_parquet(path: Path) -> None:
    """A data file rlcore validate accepts (it reads a sample of the rows); empty where pyarrow is
    missing (a bare core, which does not read parquet rows at validate)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        path.touch()
        return
    row = {
        "prompt": [{"role": "user", "content": "1 + 1?"}],
        "data_source": "openai/gsm8k",
        "reward_model": {"ground_truth": "2", "style": "rule"},
    }
    pq.write_table(pa.Table.from_pylist([row]), path)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """$HOME with the data files and model directories the scripts name; the working directory."""
    home = tmp_path / "home"
    for f in (
        "data/gsm8k/train.parquet",
        "data/gsm8k/test.parquet",
        "data/mix/train.parquet",
        "data/mix/test.parquet",
        "verl/data/dapo-math-17k.parquet",
        "verl/data/aime-2024.parquet",
    ):
        (home / f).parent.mkdir(parents=True, exist_ok=True)
        _one_row_parquet(home / f)
    for d in ("verl/models/Qwen2.5-32B", "models/Qwen2.5-3B-Instruct"):
        (home / d).mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    return home


def from_verl(capfd, *args: str) -> tuple[int, str, str]:
    code = main(["from-verl", *args])
    out, err = capfd.readouterr()
    return code, out, err


def validated(path: Path):
    from rlcore.manifest.loader import load_manifest

    require_plugins(*TARGETS)
    return load_manifest(path)


def table(path: Path) -> dict:
    return tomllib.loads(path.read_text())


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (
            "ppo_gae.sh",
            {
                ("algorithm", "advantage"): "gae",
                ("critic", "lr"): 1e-05,
                ("rollout", "tensor_parallel_size"): 4,
                ("trainer", "micro_batch_tokens"): 16 * 1024,
                ("algorithm", "mini_batches"): 4,
                ("launcher", "workers"): 8,
                ("trainer", "eval_every"): 1,
            },
        ),
        (
            "grpo_seq_balance.sh",
            {
                ("rollout", "engine"): "sglang",
                ("rollout", "samples_per_prompt"): 5,
                ("algorithm", "kl_coef"): 0.001,
                ("algorithm", "kl_estimator"): "k3",
                ("trainer", "micro_batch_tokens"): 24000,
                ("data", "max_response_tokens"): 1024,
            },
        ),
        (
            "multinode_offload_lora.sh",
            {
                ("model.lora", "rank"): 64,
                ("model.lora", "alpha"): 32.0,
                ("trainer", "fsdp_offload"): True,
                ("launcher", "workers"): 16,
                ("launcher", "address"): "auto",
                ("trainer", "micro_batch_tokens"): 4 * 3072,
                ("data", "shuffle"): False,
                ("run", "name"): "GRPO-Qwen2.5-3B-LoRA-2nodes",
            },
        ),
    ],
)
def test_ppo_grpo_and_multi_node_scripts_convert_and_validate(home, tmp_path, capfd, script, expected):
    out = tmp_path / "m.toml"
    code, stdout, err = from_verl(capfd, str(SCRIPTS / script), "--out", str(out))
    assert code == 0, err
    assert stdout == "" and "everything essential mapped" in err
    doc = table(out)
    assert {
        (t, k): doc[t.split(".")[0]][t.split(".")[1]][k] if "." in t else doc[t][k] for t, k in expected
    } == expected
    validated(out)


def test_the_seq_balance_mixture_needs_one_train_file_then_validates(home, tmp_path):
    """As typed in a shell: rlcore from-verl run_qwen2-7b_seq_balance.sh > m.toml && rlcore validate m.toml."""
    require_plugins(*TARGETS)
    rlcore = f"{sys.executable} -m rlcore"
    script = SCRIPTS / "ppo_seq_balance.sh"
    first = subprocess.run(
        f"{rlcore} from-verl {script} > m.toml", shell=True, capture_output=True, text=True, cwd=tmp_path
    )
    assert first.returncode == 1
    assert "ESSENTIAL data.train_files" in first.stderr and "concatenate them into one" in first.stderr
    assert "rlcore packs sequences always" in first.stderr  # the unmapped keys are listed, with why
    merged = f"data.train_files={home}/data/mix/train.parquet data.val_files={home}/data/mix/test.parquet"
    second = subprocess.run(
        f"{rlcore} from-verl {script} {merged} > m.toml && {rlcore} validate m.toml",
        shell=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert second.returncode == 0, second.stderr
    assert "everything essential mapped" in second.stderr and "ok m.toml" in second.stdout
    assert "critic.ppo_max_token_len_per_gpu = 98304 (ppo_seq_balance.sh:47)" in second.stderr
    doc = table(tmp_path / "m.toml")
    assert doc["data"]["train"] == f"{home}/data/mix/train.parquet" and doc["algorithm"]["mini_batches"] == 8


def test_dapo_maps_onto_todays_algorithm_keys(home, tmp_path, capfd):
    out = tmp_path / "dapo.toml"
    code, _, err = from_verl(capfd, str(SCRIPTS / "dapo.sh"), "--out", str(out))
    assert code == 0, err  # verl's metric = acc, max_num_gen_batches and gen_batch_size all map
    assert "algorithm.filter_groups" not in err and "data.gen_batch_size" not in err
    doc = table(out)
    dapo = {"clip_ratio_high": 0.28, "clip_ratio_c": 10.0}
    assert {k: doc["algorithm"][k] for k in dapo} == dapo
    # rlcore-algo-dapo's tables
    assert doc["filters"] == {
        "dynamic_sampling": {"max_generation_rounds": 10, "on_exhausted": "raise", "metric": "acc"}
    }
    assert doc["data"]["gen_batch_size"] == 3 * doc["data"]["prompts_per_step"]  # the script's gen_prompt_bsz
    assert "algorithm.filter_groups.metric" in out.read_text()  # each line names its verl key
    assert doc["shapers"] == {"overlong": {"buffer": 4096, "penalty": 1.0}}
    assert doc["trainer"]["weight_decay"] == 0.1 and doc["trainer"]["warmup_steps"] == 10
    assert doc["launcher"] == {
        "name": "ray",
        "workers": 128,
        "gpus_per_worker": 1,
        "job": True,
        "address": "http://localhost:8265",
    }
    assert doc["reward"]["function"] == "verl"  # DAPO-Math-17k's data_source math_dapo: the math_dapo scorer
    validated(out)


def test_overrides_typed_or_pasted_and_unknown_keys(home, tmp_path, capfd):
    words = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={home}/data/gsm8k/train.parquet",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=4",
        "trainer.n_gpus_per_node=1",
    ]
    code, stdout, err = from_verl(capfd, *words)
    assert code == 0, err
    assert (
        'advantage = "grpo"' in stdout and "samples_per_prompt = 4" in stdout and "[launcher]" not in stdout
    )
    code, pasted, _ = from_verl(capfd, "--", "python3", "-m", "verl.trainer.main_ppo", *words)
    assert code == 0 and pasted == stdout
    code, _, err = from_verl(capfd, *words, "actor_rollout_ref.actor.optim.lrr=1e-5", "+trainer.my_tag=x")
    assert code == 1
    assert (
        "actor_rollout_ref.actor.optim.lrr (command line): verl refuses it (not in its config); did you mean "
        "actor_rollout_ref.actor.optim.lr?" in err
    )
    assert "trainer.my_tag (command line): added with '+', verl does not read it" in err


def test_a_yaml_config_then_overrides(home, tmp_path, capfd):
    config = tmp_path / "verl.yaml"
    config.write_text(
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  train_files: data/gsm8k/train.parquet\n  train_batch_size: 128\n  max_response_length: 512\n"
        "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 32\n    optim:\n      lr: 3.0e-06\n"
        "  rollout:\n    name: vllm\n    n: 8\n"
        "algorithm:\n  adv_estimator: grpo\n"
    )
    code, stdout, err = from_verl(capfd, str(config), "actor_rollout_ref.rollout.n=16")
    assert code == 0, err
    assert "its Hydra defaults list is not composed" in err
    doc = tomllib.loads(stdout)
    assert (doc["data"]["prompts_per_step"], doc["algorithm"]["mini_batches"], doc["trainer"]["lr"]) == (
        128,
        4,
        3e-06,
    )
    assert doc["rollout"]["samples_per_prompt"] == 16  # the override wins over the file
    assert (
        doc["data"]["max_response_tokens"] == 512
    )  # equal to verl's default, still rlcore's differs: written
    assert (
        "# verl: actor_rollout_ref.actor.optim.lr\n" in stdout
        or "verl: actor_rollout_ref.actor.optim.lr" in stdout
    )


def test_a_script_on_stdin(home, capfd, monkeypatch):
    monkeypatch.setattr(
        sys, "stdin", io.StringIO("python3 -m verl.trainer.main_ppo algorithm.adv_estimator=rloo $@\n")
    )
    code, stdout, err = from_verl(capfd, "-", "actor_rollout_ref.rollout.name=hf")
    assert code == 0, err
    assert 'advantage = "rloo"' in stdout and 'engine = "hf"' in stdout


def test_out_is_kept_unless_forced_and_bad_inputs_are_usage_errors(home, tmp_path, capfd):
    def refused(*args: str) -> str:
        code, out, err = from_verl(capfd, *args)
        assert code == 2 and "Traceback" not in out + err
        return out + err  # rlcore prints errors on its console

    out = tmp_path / "m.toml"
    out.write_text("keep me")
    assert "exists; give --force" in refused("algorithm.adv_estimator=grpo", "--out", str(out))
    assert out.read_text() == "keep me"
    assert "'nosuch.sh' is not a file, a .yaml config or a KEY=VALUE override" in refused("nosuch.sh")
    (tmp_path / "other.sh").write_text("echo hi\n")
    assert "other.sh: no verl training command found" in refused(str(tmp_path / "other.sh"))
    assert "command line: trainer.save_freq: '5,10' is a sweep" in refused("trainer.save_freq=5,10")


def test_the_command_is_registered_by_the_plugin_and_registering_is_light():
    from rlcore.registry import Registry

    commands = {c.name: c for c in Registry.discover().commands()}
    assert commands["from-verl"].distribution == "rlcore-verl"
    code = (
        "import sys; from rlcore.registry import Registry; Registry.discover().commands(); "
        "print(sorted(m for m in ('torch', 'yaml', 'rlcore_verl.mapping') if m in sys.modules))"
    )
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "[]"
    )
