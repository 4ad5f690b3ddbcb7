"""verl keys -> manifest keys, each case worked out by hand from verl's meaning of the key
(verl b178a3cd: trainer/config/ppo_trainer.yaml and the code reading it; DAPO from verl-recipe 48ea0a79)."""

from __future__ import annotations

import pytest
from rlcore_verl.config import VerlConfig
from rlcore_verl.hydra import parse_override
from rlcore_verl.manifest import render
from rlcore_verl.mapping import Conversion, Options, convert
from rlcore_verl.verl_defaults import DAPO_DEFAULTS, PPO_DEFAULTS

from rlcore.errors import UsageError

A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."


def conv(*words: str, module: str = "verl.trainer.main_ppo", **options) -> Conversion:
    cfg = VerlConfig(module)
    for word in words:
        cfg.apply_override(parse_override(word, "command line"))
    return convert(cfg, Options(**options))


def value(c: Conversion, table: str, key: str):
    return c.value_of(table, key)


def unmapped(c: Conversion) -> dict[str, tuple[str, bool]]:
    return {u.key: (u.reason, u.essential) for u in c.unmapped}


def test_verls_defaults_are_what_a_bare_command_means():
    c = conv("actor_rollout_ref.rollout.name=vllm")
    assert value(c, "algorithm", "advantage") == "gae"  # verl's default estimator, with a critic
    assert value(c, "trainer", "total_epochs") == 30
    assert value(c, "data", "max_response_tokens") == 512
    assert value(c, "data", "prompts_per_step") == 1024
    assert value(c, "algorithm", "mini_batches") == 4  # 1024 / 256
    assert value(c, "trainer", "weight_decay") == 0.01
    assert value(c, "rollout", "tensor_parallel_size") == 2
    assert value(c, "launcher", "workers") == 8 and value(c, "launcher", "name") == "ray"
    assert (
        unmapped(c)["data.train_files"][0]
        == "not set: verl's default '~/data/rlhf/gsm8k/train.parquet' is written"
    )
    text = render(c, ["the command line"])
    assert "max_response_tokens = 512" in text and "# verl: data.max_response_length (verl's default)" in text
    assert "\nlr = " not in text  # 1e-6 is rlcore's default too: not written
    assert "max_prompt_tokens" not in text  # 512 both


def test_a_command_without_a_rollout_engine_is_reported():
    c = conv()
    assert "not set (verl requires it)" in unmapped(c)[R + "name"][0]


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (("data.train_batch_size=512", A + "ppo_mini_batch_size=32"), 16),
        (("data.train_batch_size=64", A + "ppo_mini_batch_size=64"), 1),
    ],
)
def test_mini_batches_count_verls_mini_batches_of_prompts(words, expected):
    assert value(conv(*words), "algorithm", "mini_batches") == expected


def test_a_mini_batch_that_does_not_divide_the_batch_is_essential():
    reason, essential = unmapped(conv("data.train_batch_size=100", A + "ppo_mini_batch_size=32"))[
        A + "ppo_mini_batch_size"
    ]
    assert essential and "does not divide data.train_batch_size = 100" in reason


@pytest.mark.parametrize(
    ("words", "tokens"),
    [
        ((A + "ppo_micro_batch_size_per_gpu=16",), 16 * (512 + 512)),  # sequences x the longest sequence
        ((A + "use_dynamic_bsz=True", A + "ppo_max_token_len_per_gpu=24000"), 24000),
        (
            (
                A + "use_dynamic_bsz=True",
                A + "ppo_max_token_len_per_gpu=8000",
                "data.max_prompt_length=2048",
                "data.max_response_length=8192",
            ),
            10240,
        ),  # at least one whole sequence
    ],
)
def test_micro_batches_become_a_token_budget(words, tokens):
    assert value(conv(*words), "trainer", "micro_batch_tokens") == tokens


def test_kl_in_the_loss_in_the_reward_or_both():
    c = conv(A + "use_kl_loss=True", A + "kl_loss_coef=0.002", A + "kl_loss_type=low_var_kl")
    assert (value(c, "algorithm", "kl_coef"), value(c, "algorithm", "kl_estimator")) == (0.002, "k3")
    c = conv("algorithm.use_kl_in_reward=True", "algorithm.kl_ctrl.kl_coef=0.005", "algorithm.kl_penalty=kl")
    assert (
        value(c, "algorithm", "kl_in_reward"),
        value(c, "algorithm", "kl_coef"),
        value(c, "algorithm", "kl_estimator"),
    ) == (True, 0.005, "k1")
    c = conv(A + "use_kl_loss=True", "algorithm.use_kl_in_reward=True")
    assert unmapped(c)["algorithm.use_kl_in_reward"][1]
    assert unmapped(conv(A + "use_kl_loss=True", A + "kl_loss_type=abs"))[A + "kl_loss_type"][1]
    assert unmapped(conv("algorithm.use_kl_in_reward=True", "algorithm.kl_ctrl.type=adaptive"))[
        "algorithm.kl_ctrl.type"
    ][1]
    assert value(conv(A + "use_kl_loss=False"), "algorithm", "kl_coef") == 0.0


def test_clip_ratio_counts_only_where_low_and_high_are_null():
    c = conv(A + "clip_ratio=0.3")  # verl: clip_ratio_low/high default to 0.2, so clip_ratio is not used
    assert (value(c, "algorithm", "clip_ratio_low"), value(c, "algorithm", "clip_ratio_high")) == (0.2, 0.2)
    c = conv(
        A + "clip_ratio=0.3", A + "clip_ratio_low=null", A + "clip_ratio_high=0.28", A + "clip_ratio_c=10.0"
    )
    assert [value(c, "algorithm", k) for k in ("clip_ratio_low", "clip_ratio_high", "clip_ratio_c")] == [
        0.3,
        0.28,
        10.0,
    ]


@pytest.mark.parametrize(
    ("estimator", "advantage", "options"),
    [
        ("grpo", "grpo", {"norm_by_std": True}),
        ("rloo", "rloo", {}),
        ("reinforce_plus_plus", "reinforce_pp", {"gamma": 1.0}),
        ("gae", "gae", {"gamma": 1.0, "lam": 1.0}),
    ],
)
def test_estimators(estimator, advantage, options):
    c = conv(f"algorithm.adv_estimator={estimator}")
    assert value(c, "algorithm", "advantage") == advantage
    assert {k: value(c, "algorithm", k) for k in options} == options


def test_dr_grpo_and_unsupported_estimators_and_losses():
    assert (
        value(
            conv("algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=False"),
            "algorithm",
            "norm_by_std",
        )
        is False
    )
    assert unmapped(conv("algorithm.adv_estimator=remax"))["algorithm.adv_estimator"][1]
    assert value(conv(A + "policy_loss.loss_mode=gspo"), "algorithm", "policy_loss") == "gspo"
    reason, essential = unmapped(conv(A + "policy_loss.loss_mode=clip_cov"))[A + "policy_loss.loss_mode"]
    assert essential and "rlcore_policy_losses" in reason
    c = conv(A + "loss_agg_mode=seq-mean-token-sum-norm", A + "loss_scale_factor=4096")
    assert value(c, "algorithm", "loss_agg_mode") == "seq-mean-token-sum-norm"
    assert value(c, "algorithm", "loss_norm_length") == 4096
    reason, essential = unmapped(conv(A + "loss_agg_mode=seq-sum"))[A + "loss_agg_mode"]
    assert (
        essential and "token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm" in reason
    )


def test_sampling_and_validation_sampling():
    c = conv(R + "name=vllm", R + "do_sample=False", R + "temperature=0.7")
    assert value(c, "rollout", "temperature") == 0.0  # greedy
    c = conv(
        R + "name=vllm",
        R + "val_kwargs.do_sample=True",
        R + "val_kwargs.temperature=1.0",
        R + "val_kwargs.top_p=0.7",
        R + "val_kwargs.n=4",
    )
    assert (value(c, "rollout", "val_temperature"), value(c, "rollout", "val_samples_per_prompt")) == (1.0, 4)
    reason, essential = unmapped(c)[R + "val_kwargs.top_p"]
    assert not essential and "[rollout] top_p" in reason
    assert value(conv(R + "name=vllm"), "rollout", "val_temperature") == 0.0  # verl: do_sample false


def test_engine_options_follow_the_engine():
    c = conv(
        R + "name=vllm",
        R + "gpu_memory_utilization=0.8",
        R + "tensor_model_parallel_size=4",
        R + "engine_kwargs.vllm.swap_space=4",
        R + "max_num_batched_tokens=22528",
    )
    assert (
        value(c, "rollout", "gpu_memory_utilization") == 0.8
        and value(c, "rollout", "tensor_parallel_size") == 4
    )
    assert value(c, "rollout", "engine_args") == {
        "swap_space": 4,
        "max_num_batched_tokens": 22528,
        "enable_chunked_prefill": True,
    }
    c = conv(R + "name=hf", R + "gpu_memory_utilization=0.8")
    assert value(c, "rollout", "engine") == "hf" and value(c, "rollout", "gpu_memory_utilization") is None
    assert "an option of the vllm and sglang engines" in unmapped(c)[R + "gpu_memory_utilization"][0]
    c = conv(R + "name=sglang", R + "max_num_batched_tokens=8192")
    assert "give SGLang's own in engine_kwargs.sglang" in unmapped(c)[R + "max_num_batched_tokens"][0]
    assert "rlcore's engines are vllm, sglang and hf" in unmapped(conv(R + "name=trtllm"))[R + "name"][0]


def test_warm_up_and_schedule():
    o = A + "optim."
    assert value(conv(o + "lr_warmup_steps=10"), "trainer", "warmup_steps") == 10
    assert (
        value(
            conv(o + "lr_warmup_steps_ratio=0.1", "trainer.total_training_steps=200"),
            "trainer",
            "warmup_steps",
        )
        == 20
    )
    assert unmapped(conv(o + "lr_warmup_steps_ratio=0.1"))[o + "lr_warmup_steps_ratio"][1]
    assert unmapped(conv(o + "lr_scheduler_type=cosine"))[o + "lr_scheduler_type"][1]
    assert value(conv(o + "betas=[0.9,0.95]", A + "grad_clip=0.5"), "trainer", "betas") == [0.9, 0.95]
    assert value(conv(A + "grad_clip=0.5"), "trainer", "grad_clip") == 0.5


def test_steps_or_epochs():
    c = conv("trainer.total_training_steps=200", "trainer.total_epochs=10")
    assert value(c, "trainer", "steps") == 200 and value(c, "trainer", "total_epochs") is None


def test_dapo_dynamic_sampling_and_overlong_buffer():
    base = (
        "+algorithm.filter_groups.enable=True",
        "+algorithm.filter_groups.max_num_gen_batches=10",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4096",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
        "data.max_response_length=20480",
        R + "n=16",
    )
    c = conv(*base, "+algorithm.filter_groups.metric=acc")
    sampling = {
        k: value(c, "filters.dynamic_sampling", k)
        for k in ("max_generation_rounds", "on_exhausted", "metric")
    }
    assert sampling == {"max_generation_rounds": 10, "on_exhausted": "raise", "metric": "acc"}
    assert (value(c, "shapers.overlong", "buffer"), value(c, "shapers.overlong", "penalty")) == (4096, 1.0)
    assert not {"algorithm.filter_groups.metric", "algorithm.filter_groups.max_num_gen_batches"} & set(
        unmapped(c)
    )
    # verl's seq_reward, and seq_final_reward without the KL in the reward: the penalised score
    for metric in ("seq_reward", "seq_final_reward"):
        c = conv(*base, f"+algorithm.filter_groups.metric={metric}")
        assert value(c, "filters.dynamic_sampling", "metric") == "score"
        assert not unmapped(c).get("algorithm.filter_groups.metric")
    # verl's score field: the reward's score before the penalty, rlcore's acc when the reward reports no acc
    assert (
        value(conv(*base, "+algorithm.filter_groups.metric=score"), "filters.dynamic_sampling", "metric")
        == "acc"
    )
    reason, essential = unmapped(
        conv(*base, "+algorithm.filter_groups.metric=seq_final_reward", "algorithm.use_kl_in_reward=True")
    )["algorithm.filter_groups.metric"]
    assert essential and "never on the KL penalty" in reason
    reason, essential = unmapped(conv(*base, "+algorithm.filter_groups.metric=pred"))[
        "algorithm.filter_groups.metric"
    ]
    assert essential and "'pred': a field of verl's reward output" in reason
    c = conv(
        "+algorithm.filter_groups.enable=True", "+algorithm.filter_groups.metric=seq_final_reward", R + "n=4"
    )
    assert (
        value(c, "filters.dynamic_sampling", "max_generation_rounds") == 0
    )  # verl's 0: unlimited, and rlcore's
    assert "algorithm.filter_groups.max_num_gen_batches" not in unmapped(c)


@pytest.mark.parametrize(
    "prefix", ["reward_model.overlong_buffer.", "reward.reward_kwargs.overlong_buffer_cfg."]
)
def test_each_layout_of_the_overlong_buffer(prefix):
    c = conv(
        f"{prefix}enable=True",
        f"{prefix}len=512",
        f"{prefix}penalty_factor=0.5",
        module="recipe.dapo.main_dapo",
    )
    assert (value(c, "shapers.overlong", "buffer"), value(c, "shapers.overlong", "penalty")) == (512, 0.5)


def test_dapo_over_generation_and_a_different_max_resp_len():
    c = conv(
        "data.gen_batch_size=1536",
        "data.train_batch_size=512",
        "reward.reward_kwargs.overlong_buffer_cfg.enable=True",
        "reward.reward_kwargs.overlong_buffer_cfg.len=512",
        "reward.reward_kwargs.max_resp_len=4096",
        module="recipe.dapo.main_dapo",
    )
    # without filter_groups verl trains every generated group: rlcore's batch would differ
    reason, essential = unmapped(c)["data.gen_batch_size"]
    assert essential and "trains every generated group, 1536 a step" in reason
    assert unmapped(c)["reward.reward_kwargs.max_resp_len"][1]
    c = conv(
        "data.gen_batch_size=1536",
        "data.train_batch_size=512",
        "algorithm.filter_groups.enable=True",
        module="recipe.dapo.main_dapo",
    )
    assert (value(c, "data", "gen_batch_size"), value(c, "data", "prompts_per_step")) == (1536, 512)
    assert "data.gen_batch_size" not in unmapped(c)
    assert (
        value(conv("data.gen_batch_size=512", "data.train_batch_size=512"), "data", "gen_batch_size") is None
    )


def test_launchers():
    assert value(conv("trainer.nnodes=1", "trainer.n_gpus_per_node=1"), "launcher", "name") is None  # local
    c = conv("trainer.nnodes=2", "trainer.n_gpus_per_node=8")
    assert [value(c, "launcher", k) for k in ("name", "workers", "gpus_per_worker", "address")] == [
        "ray",
        16,
        1,
        "auto",
    ]
    c = conv("trainer.nnodes=2", "trainer.n_gpus_per_node=8", launcher="slurm")
    assert [value(c, "launcher", k) for k in ("name", "nodes", "gpus_per_node")] == ["slurm", 2, 8]
    c = conv("trainer.nnodes=4", ray_job=True, ray_job_address="http://head:8265")
    assert [value(c, "launcher", k) for k in ("job", "address")] == [True, "http://head:8265"]
    c = conv("trainer.nnodes=1", "trainer.n_gpus_per_node=4", launcher="local")
    assert "torchrun --nproc-per-node 4" in unmapped(c)["trainer.n_gpus_per_node"][0]


def test_rewards():
    assert value(conv(), "reward", "function") == "verl"
    c = conv("custom_reward_function.path=rewards/mine.py", "custom_reward_function.name=score")
    assert value(c, "reward", "function") == "python:rewards/mine.py:score"
    c = conv(
        "reward_model.enable=True", "reward_model.model.path=/rm", "reward_model.micro_batch_size_per_gpu=16"
    )
    assert [value(c, "reward", k) for k in ("function", "path", "batch_size")] == ["reward_model", "/rm", 16]
    assert unmapped(conv("reward_model.reward_manager=batch"))["reward_model.reward_manager"][1]


def test_model_keys():
    c = conv(
        "actor_rollout_ref.model.lora_rank=64",
        "actor_rollout_ref.model.lora_alpha=32",
        "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
        A + "fsdp_config.model_dtype=bf16",
    )
    assert [value(c, "model.lora", k) for k in ("rank", "alpha", "target_modules")] == [
        64,
        32.0,
        ["q_proj", "v_proj"],
    ]
    assert value(c, "model", "dtype") == "bfloat16"
    assert value(conv(), "model.lora", "rank") is None
    reason, essential = unmapped(
        conv("+actor_rollout_ref.model.override_config.max_position_embeddings=32768")
    )["actor_rollout_ref.model.override_config.max_position_embeddings"]
    assert essential and "32768" in reason
    c = conv(A + "fsdp_config.param_offload=True", A + "fsdp_config.optimizer_offload=True")
    assert value(c, "trainer", "fsdp_offload") is True


def test_data_keys():
    c = conv("data.train_files=['a.parquet','b.parquet']")
    reason, essential = unmapped(c)["data.train_files"]
    assert essential and "concatenate them into one" in reason and value(c, "data", "train") is None
    assert unmapped(conv("data.train_max_samples=1000"))["data.train_max_samples"][1]
    assert value(conv("data.val_max_samples=64"), "data", "val_max_prompts") == 64
    assert value(
        conv("data.apply_chat_template_kwargs.enable_thinking=False"), "data", "chat_template_kwargs"
    ) == {"enable_thinking": False}


def test_run_directory():
    c = conv("trainer.project_name=p", "trainer.experiment_name=e")
    assert (value(c, "run", "name"), value(c, "run", "output_dir")) == ("e", "checkpoints/p")
    c = conv("trainer.default_local_dir=/ckpts/DAPO/run1")
    assert (value(c, "run", "name"), value(c, "run", "output_dir")) == ("run1", "/ckpts/DAPO")


def test_relative_paths_are_rewritten_for_the_manifests_directory(tmp_path):
    (tmp_path / "models" / "m").mkdir(parents=True)
    c = conv(
        "data.train_files=data/train.parquet",
        "actor_rollout_ref.model.path=models/m",
        "actor_rollout_ref.rollout.name=vllm",
        out_dir=tmp_path / "out",
        cwd=tmp_path,
    )
    assert value(c, "data", "train") == "../data/train.parquet"
    assert value(c, "model", "path") == "../models/m"
    c = conv("actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct", out_dir=tmp_path / "out", cwd=tmp_path)
    assert value(c, "model", "path") == "Qwen/Qwen2-7B-Instruct"  # a hub id: not a directory here


def test_unknown_keys_get_the_nearest_verl_key_and_refused_plus_is_reported():
    cfg = VerlConfig()
    for word in (
        "actor_rollout_ref.actor.optim.lrr=1e-6",
        "+my_project.tag=x",
        "+trainer.nnodes=2",
        "reward_model.overlong_buffer.len=4",
    ):
        cfg.apply_override(parse_override(word, "command line"))
    assert cfg.unknown == {
        "actor_rollout_ref.actor.optim.lrr": ("command line", False),
        "my_project.tag": ("command line", True),
    }
    assert cfg.suggestion("actor_rollout_ref.actor.optim.lrr") == "actor_rollout_ref.actor.optim.lr"
    messages = [m for _, _, m in cfg.problems]
    assert any("+trainer.nnodes: verl already has this key" in m for m in messages)
    assert any(
        "reward_model.overlong_buffer.len: verl.trainer.main_ppo's config has no such key" in m
        for m in messages
    )


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 3
    if isinstance(value, float):
        return value * 2 + 0.1
    if isinstance(value, list):
        return ["x"]
    if isinstance(value, dict):
        return {"x": 1}
    return "x"


def test_every_verl_key_is_mapped_or_explained():
    """Each key of ppo_trainer.yaml (and DAPO's), set on its own to a value other than its
    default, is read by a rule (which may refuse a value of the wrong type, naming the key) or
    explained; none is left without a reason."""
    missing, no_rule = [], []
    for key, default in {**PPO_DEFAULTS, **DAPO_DEFAULTS}.items():
        cfg = VerlConfig("recipe.dapo.main_dapo")
        cfg.set(key, _changed(default), "test")
        try:
            c = convert(cfg, Options())
        except UsageError as exc:
            assert f"test: {key} = " in str(exc)
            continue
        if key not in c.handled | {u.key for u in c.unmapped}:
            missing.append(key)
        no_rule += [u.key for u in c.unmapped if "has no rule" in u.reason]
    assert (missing, no_rule) == ([], [])


def test_a_value_of_the_wrong_type_is_a_located_error():
    with pytest.raises(
        UsageError, match=r"command line: data.train_batch_size = 'many': expected an integer"
    ):
        conv("data.train_batch_size=many")


def test_each_manifest_line_names_its_verl_keys():
    c = conv("data.max_response_length=1024", R + "name=vllm", R + "n=8", A + "ppo_mini_batch_size=128")
    text = render(c, ["run.sh"])
    assert "max_response_tokens = 1024" in text and "# verl: data.max_response_length\n" in text
    assert (
        "mini_batches = 8" in text
        and "# verl: actor_rollout_ref.actor.ppo_mini_batch_size; 1024 / 128" in text
    )
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            assert "# verl: " in line, line
    essential = render(conv("algorithm.adv_estimator=remax"), ["x"])
    assert (
        "# NOT MAPPED, and it changes what is trained" in essential
        and "algorithm.adv_estimator: 'remax'" in essential
    )


def test_a_saved_run_config_counts_only_what_differs_from_verls_defaults():
    """A verl run's saved config repeats every default, interpolations resolved, with class names
    and profiler options: only the real settings count as set."""
    cfg = VerlConfig()
    cfg.apply_yaml(
        {
            "actor_rollout_ref.rollout.n": 5,
            "actor_rollout_ref.actor.rollout_n": 5,
            "critic.rollout_n": 5,
            "actor_rollout_ref.actor._target_": "verl.workers.config.FSDPActorConfig",
            "actor_rollout_ref.actor.profiler.all_ranks": False,
            "actor_rollout_ref.actor.optim.lr": 1e-6,
            "data.max_response_length": 1024,
            "actor_rollout_ref.rollout.response_length": 1024,
        },
        "config.yaml",
    )
    assert sorted(cfg.given_keys()) == ["actor_rollout_ref.rollout.n", "data.max_response_length"]
