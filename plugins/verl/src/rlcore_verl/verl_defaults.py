"""verl's trainer configuration: every key of ``verl/trainer/config/ppo_trainer.yaml`` (as composed
into ``_generated_ppo_trainer.yaml``) with its default, at verl b178a3cd, and the keys verl's DAPO
recipe adds (verl-recipe 48ea0a79, ``dapo/config/dapo_trainer.yaml``).

The converter starts from these values, so a key a command line leaves out means what it means in
verl (verl's default ``max_response_length`` is 512, rlcore's 256). Values of the form ``${...}``
are verl's own interpolations, resolved once the command line is applied. Profiler and
``_target_`` keys are left out here; :mod:`rlcore_verl.mapping` explains them by prefix.
"""

from __future__ import annotations

from typing import Any

from rlcore_verl.hydra import flatten

VERL_COMMIT = "b178a3cd"
RECIPE_COMMIT = "48ea0a79"

_OPTIM = {
    "optimizer": "AdamW", "optimizer_impl": "torch.optim", "lr": 1e-6, "lr_warmup_steps_ratio": 0.0,
    "total_training_steps": -1, "weight_decay": 0.01, "lr_warmup_steps": -1, "betas": [0.9, 0.999],
    "clip_grad": 1.0, "min_lr_ratio": 0.0, "num_cycles": 0.5, "lr_scheduler_type": "constant",
    "warmup_style": None, "override_optimizer_config": None,
}


def _fsdp(forward_only: bool) -> dict[str, Any]:
    return {
        "wrap_policy": {"min_num_params": 0}, "param_offload": False, "optimizer_offload": False,
        "offload_policy": False, "reshard_after_forward": True, "fsdp_size": -1, "forward_prefetch": False,
        "model_dtype": "fp32", "use_orig_params": False, "seed": 42, "full_determinism": False,
        "ulysses_sequence_parallel_size": 1, "entropy_from_logits_with_chunking": False, "use_torch_compile": True,
        "entropy_checkpointing": False, "forward_only": forward_only, "strategy": "fsdp", "dtype": "bfloat16",
    }


_ROUTER_REPLAY = {"mode": "disabled", "record_file": None, "replay_file": None}
_CHECKPOINT = {"save_contents": ["model", "optimizer", "extra"], "load_contents": "${.save_contents}", "async_save": False}

_TREE: dict[str, Any] = {
    "actor_rollout_ref": {
        "actor": {
            "optim": _OPTIM, "fsdp_config": _fsdp(False),
            "rollout_n": "${oc.select:actor_rollout_ref.rollout.n,1}", "strategy": "fsdp",
            "ppo_mini_batch_size": 256, "ppo_micro_batch_size": None, "ppo_micro_batch_size_per_gpu": None,
            "use_dynamic_bsz": False, "ppo_max_token_len_per_gpu": 16384,
            "clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "tau_pos": 1.0, "tau_neg": 1.05,
            "freeze_vision_tower": False,
            "policy_loss": {"loss_mode": "vanilla", "clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0,
                            "kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1},
            "clip_ratio_c": 3.0, "loss_agg_mode": "token-mean", "loss_scale_factor": None, "entropy_coeff": 0,
            "calculate_entropy": False, "use_kl_loss": False, "use_prefix_grouper": False, "use_torch_compile": True,
            "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl", "ppo_epochs": 1, "shuffle": False,
            "data_loader_seed": 42, "checkpoint": _CHECKPOINT,
            "use_fused_kernels": "${oc.select:actor_rollout_ref.model.use_fused_kernels,false}",
            "router_replay": _ROUTER_REPLAY, "grad_clip": 1.0, "ulysses_sequence_parallel_size": 1,
            "entropy_from_logits_with_chunking": False, "entropy_checkpointing": False,
            "use_remove_padding": "${oc.select:actor_rollout_ref.model.use_remove_padding,false}",
            "calculate_sum_pi_squared": False, "sum_pi_squared_checkpointing": False,
        },
        "ref": {
            "rollout_n": "${oc.select:actor_rollout_ref.rollout.n,1}", "strategy": "${actor_rollout_ref.actor.strategy}",
            "use_torch_compile": "${oc.select:actor_rollout_ref.actor.use_torch_compile,true}",
            "log_prob_micro_batch_size": None, "log_prob_micro_batch_size_per_gpu": None,
            "log_prob_use_dynamic_bsz": "${oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false}",
            "log_prob_max_token_len_per_gpu": "${oc.select:actor_rollout_ref.actor.ppo_max_token_len_per_gpu,16384}",
            "router_replay": _ROUTER_REPLAY, "fsdp_config": _fsdp(True),
            "ulysses_sequence_parallel_size": "${oc.select:actor_rollout_ref.actor.ulysses_sequence_parallel_size,1}",
            "entropy_from_logits_with_chunking": False, "entropy_checkpointing": False,
        },
        "rollout": {
            "name": "???", "mode": "async", "temperature": 1.0, "top_k": -1, "top_p": 1,
            "prompt_length": "${oc.select:data.max_prompt_length,512}",
            "response_length": "${oc.select:data.max_response_length,512}",
            "dtype": "bfloat16", "gpu_memory_utilization": 0.5, "ignore_eos": False, "enforce_eager": False,
            "cudagraph_capture_sizes": None, "free_cache_engine": True, "tensor_model_parallel_size": 2,
            "data_parallel_size": 1, "expert_parallel_size": 1, "pipeline_model_parallel_size": 1,
            "max_num_batched_tokens": 8192, "max_model_len": None, "max_num_seqs": 256,
            "enable_chunked_prefill": True, "enable_prefix_caching": True, "logprobs_mode": "processed_logprobs",
            "scheduling_policy": "fcfs", "load_format": "dummy", "log_prob_micro_batch_size": None,
            "log_prob_micro_batch_size_per_gpu": None,
            "log_prob_use_dynamic_bsz": "${oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false}",
            "log_prob_max_token_len_per_gpu": "${oc.select:actor_rollout_ref.actor.ppo_max_token_len_per_gpu,16384}",
            "disable_log_stats": True, "do_sample": True, "n": 1, "over_sample_rate": 0, "multi_stage_wake_up": False,
            "engine_kwargs": {"vllm": {}, "sglang": {}, "trtllm": {}},
            "val_kwargs": {"top_k": -1, "top_p": 1.0, "temperature": 0, "n": 1, "do_sample": False},
            "multi_turn": {
                "enable": False, "max_assistant_turns": None, "tool_config_path": None, "max_user_turns": None,
                "max_parallel_calls": 1, "max_tool_response_length": 256, "tool_response_truncate_side": "middle",
                "interaction_config_path": None, "use_inference_chat_template": False,
                "tokenization_sanity_check_mode": "strict", "format": "hermes", "num_repeat_rollouts": None,
            },
            "calculate_log_probs": False,
            "agent": {"num_workers": 8, "default_agent_loop": "single_turn_agent", "agent_loop_config_path": None,
                      "custom_async_server": {"path": None, "name": None}},
            "checkpoint_engine": {"backend": "naive", "update_weights_bucket_megabytes": 2048, "engine_kwargs": {}},
            "trace": {"backend": None, "token2text": False, "max_samples_per_step_per_worker": None},
            "skip_rollout": False, "skip_dump_dir": "/tmp/rollout_dump", "skip_tokenizer_init": True,
            "enable_rollout_routing_replay": False,
            "prometheus": {"enable": False, "port": 9090, "file": "/tmp/ray/session_latest/metrics/prometheus/prometheus.yml",
                           "served_model_name": "${oc.select:actor_rollout_ref.model.path,null}"},
            "quantization": None, "quantization_config_file": None,
            "mtp": "${oc.select:actor_rollout_ref.model.mtp, null}", "layered_summon": False,
        },
        "model": {
            "path": "~/models/deepseek-llm-7b-chat", "hf_config_path": None, "tokenizer_path": None, "use_shm": False,
            "trust_remote_code": False, "custom_chat_template": None, "external_lib": None, "override_config": {},
            "enable_gradient_checkpointing": True, "enable_activation_offload": False, "use_remove_padding": True,
            "lora_rank": 0, "lora_alpha": 16, "target_modules": "all-linear", "exclude_modules": None,
            "lora_adapter_path": None, "use_liger": False, "use_fused_kernels": False,
            "fused_kernel_options": {"impl_backend": "torch"}, "tiled_mlp": {"enabled": False, "num_shards": 4},
            "mtp": {"enable": False, "enable_train": False, "enable_rollout": False, "detach_encoder": False,
                    "mtp_loss_scaling_factor": 0.1, "speculative_algorithm": "EAGLE", "speculative_num_steps": 2,
                    "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 4, "method": "mtp",
                    "num_speculative_tokens": 1},
        },
        "hybrid_engine": True, "nccl_timeout": 600,
    },
    "data": {
        "tokenizer": None, "use_shm": False, "train_files": "~/data/rlhf/gsm8k/train.parquet",
        "val_files": "~/data/rlhf/gsm8k/test.parquet", "train_max_samples": -1, "val_max_samples": -1,
        "prompt_key": "prompt", "reward_fn_key": "data_source", "max_prompt_length": 512, "max_response_length": 512,
        "train_batch_size": 1024, "val_batch_size": None,
        "tool_config_path": "${oc.select:actor_rollout_ref.rollout.multi_turn.tool_config_path, null}",
        "return_raw_input_ids": False, "return_raw_chat": True, "return_full_prompt": False, "shuffle": True,
        "seed": None, "dataloader_num_workers": 8, "image_patch_size": 14, "validation_shuffle": False,
        "filter_overlong_prompts": False, "filter_overlong_prompts_workers": 1, "truncation": "error",
        "image_key": "images", "video_key": "videos", "trust_remote_code": False,
        "custom_cls": {"path": None, "name": None}, "return_multi_modal_inputs": True,
        "sampler": {"class_path": None, "class_name": None}, "datagen": {"path": None, "name": None},
        "apply_chat_template_kwargs": {},
    },
    "reward_manager": {"source": "register", "name": "${oc.select:reward_model.reward_manager,naive}",
                       "module": {"path": None, "name": "custom_reward_manager"}},
    "critic": {
        "optim": {**_OPTIM, "lr": 1e-5},
        "model": {
            "fsdp_config": _fsdp(False), "path": "~/models/deepseek-llm-7b-chat",
            "tokenizer_path": '${oc.select:actor_rollout_ref.model.path,"~/models/deepseek-llm-7b-chat"}',
            "override_config": {}, "external_lib": "${oc.select:actor_rollout_ref.model.external_lib,null}",
            "trust_remote_code": "${oc.select:actor_rollout_ref.model.trust_remote_code,false}", "use_shm": False,
            "enable_gradient_checkpointing": True, "enable_activation_offload": False, "use_remove_padding": False,
            "lora_rank": 0, "lora_alpha": 16, "target_modules": "all-linear",
            "tiled_mlp": {"enabled": False, "num_shards": 4},
        },
        "rollout_n": "${oc.select:actor_rollout_ref.rollout.n,1}", "strategy": "fsdp", "enable": None,
        "ppo_mini_batch_size": "${oc.select:actor_rollout_ref.actor.ppo_mini_batch_size,256}",
        "ppo_micro_batch_size": None, "ppo_micro_batch_size_per_gpu": "${oc.select:.ppo_micro_batch_size,null}",
        "use_dynamic_bsz": "${oc.select:actor_rollout_ref.actor.use_dynamic_bsz,false}",
        "ppo_max_token_len_per_gpu": 32768, "forward_max_token_len_per_gpu": "${.ppo_max_token_len_per_gpu}",
        "ppo_epochs": "${oc.select:actor_rollout_ref.actor.ppo_epochs,1}",
        "shuffle": "${oc.select:actor_rollout_ref.actor.shuffle,false}", "data_loader_seed": 42,
        "cliprange_value": 0.5, "loss_agg_mode": "${oc.select:actor_rollout_ref.actor.loss_agg_mode,token-mean}",
        "checkpoint": _CHECKPOINT, "forward_micro_batch_size": "${oc.select:.ppo_micro_batch_size,null}",
        "forward_micro_batch_size_per_gpu": "${oc.select:.ppo_micro_batch_size_per_gpu,null}",
        "ulysses_sequence_parallel_size": 1, "grad_clip": 1.0,
    },
    "reward_model": {
        "enable": False, "enable_resource_pool": False, "n_gpus_per_node": 8, "nnodes": 0, "strategy": "fsdp",
        "model": {
            "input_tokenizer": "${actor_rollout_ref.model.path}", "path": "~/models/FsfairX-LLaMA3-RM-v0.1",
            "external_lib": "${actor_rollout_ref.model.external_lib}", "trust_remote_code": False,
            "override_config": {}, "use_shm": False, "use_remove_padding": False,
            "use_fused_kernels": "${actor_rollout_ref.model.use_fused_kernels}",
            "fsdp_config": {"wrap_policy": {"min_num_params": 0}, "param_offload": False, "reshard_after_forward": True,
                            "fsdp_size": -1, "forward_prefetch": False},
        },
        "micro_batch_size": None, "micro_batch_size_per_gpu": None, "max_length": None,
        "use_dynamic_bsz": "${critic.use_dynamic_bsz}", "forward_max_token_len_per_gpu": "${critic.forward_max_token_len_per_gpu}",
        "reward_manager": "naive", "reward_loop_source": "register", "reward_loop_module_path": None,
        "reward_loop_class_name": None, "launch_reward_fn_async": False,
        "sandbox_fusion": {"url": None, "max_concurrent": 64, "memory_limit_mb": 1024},
        "ulysses_sequence_parallel_size": 1, "use_reward_loop": True, "num_workers": 1,
        "rollout": {
            "name": "???", "dtype": "bfloat16", "gpu_memory_utilization": 0.5, "enforce_eager": True,
            "cudagraph_capture_sizes": None, "free_cache_engine": True, "data_parallel_size": 1,
            "expert_parallel_size": 1, "tensor_model_parallel_size": 2, "max_num_batched_tokens": 8192,
            "max_model_len": None, "max_num_seqs": 1024, "load_format": "auto", "engine_kwargs": {},
            "limit_images": None, "enable_chunked_prefill": True, "enable_prefix_caching": True,
            "disable_log_stats": True, "skip_tokenizer_init": False, "prompt_length": 2048, "response_length": 2048,
        },
    },
    "algorithm": {
        "rollout_correction": {"rollout_is": None, "rollout_is_threshold": 2.0, "rollout_rs": None,
                               "rollout_rs_threshold": None, "bypass_mode": False, "loss_type": "ppo_clip",
                               "rollout_is_batch_normalize": False},
        "gamma": 1.0, "lam": 1.0, "adv_estimator": "gae", "norm_adv_by_std_in_grpo": True,
        "use_kl_in_reward": False, "kl_penalty": "kl",
        "kl_ctrl": {"type": "fixed", "kl_coef": 0.001, "horizon": 10000, "target_kl": 0.1},
        "use_pf_ppo": False, "pf_ppo": {"reweight_method": "pow", "weight_pow": 2.0},
    },
    "custom_reward_function": {"path": None, "name": "compute_score"},
    "trainer": {
        "balance_batch": True, "total_epochs": 30, "total_training_steps": None, "project_name": "verl_examples",
        "experiment_name": "gsm8k", "logger": ["console", "wandb"], "log_val_generations": 0,
        "rollout_data_dir": None, "validation_data_dir": None, "nnodes": 1, "n_gpus_per_node": 8,
        "save_freq": -1, "esi_redundant_time": 0, "resume_mode": "auto", "resume_from_path": None,
        "val_before_train": True, "val_only": False, "test_freq": -1, "critic_warmup": 0,
        "default_hdfs_dir": None, "del_local_ckpt_after_load": False,
        "default_local_dir": "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        "max_actor_ckpt_to_keep": None, "max_critic_ckpt_to_keep": None,
        "ray_wait_register_center_timeout": 300, "device": "cuda", "use_legacy_worker_impl": "auto",
    },
    "global_profiler": {"tool": None, "steps": None, "profile_continuous_steps": False, "save_path": "outputs/profile"},
    "transfer_queue": {"enable": False},
    "ray_kwargs": {"ray_init": {"num_cpus": None}, "timeline_json_file": None},
}

# The DAPO recipe's own keys, in the three layouts its scripts use (dapo_trainer.yaml's
# reward.reward_kwargs, the examples' reward_model.reward_kwargs, older scripts' reward_model.overlong_buffer).
_DAPO_TREE: dict[str, Any] = {
    "data": {"gen_batch_size": "${data.train_batch_size}"},
    "algorithm": {"filter_groups": {"enable": False, "metric": None, "max_num_gen_batches": 0}},
    "reward": {
        "reward_manager": {"name": "dapo"},
        "reward_kwargs": {"overlong_buffer_cfg": {"enable": False, "len": 0, "penalty_factor": 0.0, "log": False},
                          "max_resp_len": None},
    },
    "reward_model": {
        "reward_kwargs": {"overlong_buffer_cfg": {"enable": False, "len": 0, "penalty_factor": 0.0, "log": False},
                          "max_resp_len": None},
        "overlong_buffer": {"enable": False, "len": 0, "penalty_factor": 0.0, "log": False},
    },
}

PPO_DEFAULTS: dict[str, Any] = flatten(_TREE)
DAPO_DEFAULTS: dict[str, Any] = flatten(_DAPO_TREE)
# Keys that hold a mapping of free-form entries (any sub-key is valid): engine arguments, model
# config overrides, chat template arguments.
OPEN_TABLES: tuple[str, ...] = (
    "actor_rollout_ref.rollout.engine_kwargs.vllm", "actor_rollout_ref.rollout.engine_kwargs.sglang",
    "actor_rollout_ref.rollout.engine_kwargs.trtllm", "actor_rollout_ref.model.override_config",
    "critic.model.override_config", "reward_model.model.override_config", "data.apply_chat_template_kwargs",
    "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs", "reward_model.rollout.engine_kwargs",
    "reward_model.reward_kwargs", "reward.reward_kwargs", "custom_reward_function.reward_kwargs",
)


def is_dapo_trainer(module: str) -> bool:
    return module.endswith(("main_dapo", "main_dapo.py"))


def defaults_for(module: str) -> tuple[dict[str, Any], frozenset[str]]:
    """verl's defaults for the trainer ``module`` runs, and the keys its own config has. Every
    trainer starts from ppo_trainer.yaml; the DAPO keys are known to all (verl's scripts add them
    to main_ppo with "+"), and ``recipe.dapo.main_dapo`` has them natively, its reward manager dapo."""
    out = {**PPO_DEFAULTS, **DAPO_DEFAULTS}
    native = set(PPO_DEFAULTS)
    if is_dapo_trainer(module):
        native |= set(DAPO_DEFAULTS)
        out["reward_model.reward_manager"] = "dapo"
        out["trainer.project_name"] = "verl-dapo"
    return out, frozenset(native)
