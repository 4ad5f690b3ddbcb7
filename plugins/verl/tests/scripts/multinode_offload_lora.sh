#!/bin/bash
# GRPO with LoRA and FSDP offload over two nodes, overrides kept in bash arrays: the shape of verl's
# NPU multi-node scripts (examples/grpo_trainer/run_qwen2-32b_sglang_fsdp_npu.sh) and its LoRA
# example (run_qwen2_5-3b_gsm8k_grpo_lora.sh), written for these tests.
set -xeuo pipefail

project_name='GRPO-Qwen2.5-3B-LoRA'
exp_name='GRPO-Qwen2.5-3B-LoRA-2nodes'

# Node Info
NNODES=${NNODES:-2}
NGPUS_PER_NODE=${NGPUS_PER_NODE:-8}

MODEL_PATH=${MODEL_PATH:-"$HOME/models/Qwen2.5-3B-Instruct"}
CKPTS_DIR=${CKPTS_DIR:-"$HOME/ckpts/${project_name}/${exp_name}"}
TRAIN_FILE=${TRAIN_FILE:-"$HOME/data/gsm8k/train.parquet"}
TEST_FILE=${TEST_FILE:-"$HOME/data/gsm8k/test.parquet"}

max_prompt_length=$((1024 * 1))
max_response_length=$((1024 * 2))
train_prompt_bsz=64
train_prompt_mini_bsz=16
n_resp_per_prompt=8
all_offload=True

DATA_CONFIG=(
    # File Paths
    data.train_files="${TRAIN_FILE}"
    data.val_files="${TEST_FILE}"
    # Batch and Length Configuration
    data.train_batch_size=${train_prompt_bsz}
    data.max_prompt_length=${max_prompt_length}
    data.max_response_length=${max_response_length}
    data.filter_overlong_prompts=True
    data.truncation='error'
    data.shuffle=False
)

MODEL_CONFIG=(
    actor_rollout_ref.model.path="${MODEL_PATH}"
    actor_rollout_ref.model.use_shm=True
    actor_rollout_ref.model.lora_rank=64
    actor_rollout_ref.model.lora_alpha=32
    actor_rollout_ref.model.target_modules=all-linear
    actor_rollout_ref.model.enable_gradient_checkpointing=True
)

ACTOR_CONFIG=(
    actor_rollout_ref.actor.optim.lr=3e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=${train_prompt_mini_bsz}
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_coef=0.001
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.fsdp_config.param_offload=${all_offload}
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=${all_offload}
    actor_rollout_ref.ref.fsdp_config.param_offload=${all_offload}
)

ROLLOUT_CONFIG=(
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=${n_resp_per_prompt}
    actor_rollout_ref.rollout.tensor_model_parallel_size=2
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
    actor_rollout_ref.rollout.load_format=safetensors
    actor_rollout_ref.rollout.layered_summon=True
)

TRAINER_CONFIG=(
    trainer.logger='["console","tensorboard"]'
    trainer.project_name="${project_name}"
    trainer.experiment_name="${exp_name}"
    trainer.nnodes="${NNODES}"
    trainer.n_gpus_per_node="${NGPUS_PER_NODE}"
    trainer.save_freq=20
    trainer.test_freq=5
    trainer.total_epochs=15
    trainer.default_local_dir="${CKPTS_DIR}"
)

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    "${DATA_CONFIG[@]}" \
    "${MODEL_CONFIG[@]}" \
    "${ACTOR_CONFIG[@]}" \
    "${ROLLOUT_CONFIG[@]}" \
    "${TRAINER_CONFIG[@]}" "$@" 2>&1 | tee "logs/${exp_name}.log"
