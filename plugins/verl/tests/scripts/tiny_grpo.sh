#!/usr/bin/env bash
# A verl GRPO command at a size a CPU runs in seconds (for the one-step test): the shape of
# verl's quickstart (examples/grpo_trainer/run_qwen2-7b.sh), scaled down.
set -xeuo pipefail

MODEL_PATH=${MODEL_PATH:-"$HOME/models/tiny"}
DATA_DIR=${DATA_DIR:-"$HOME/data/gsm8k"}
n_resp_per_prompt=2

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$DATA_DIR/train.parquet \
    data.val_files=$DATA_DIR/test.parquet \
    data.train_batch_size=4 \
    data.max_prompt_length=128 \
    data.max_response_length=6 \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.enable_gradient_checkpointing=False \
    actor_rollout_ref.actor.optim.lr=1e-3 \
    actor_rollout_ref.actor.ppo_mini_batch_size=2 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.rollout.n=${n_resp_per_prompt} \
    trainer.logger='["console"]' \
    trainer.project_name=tiny \
    trainer.experiment_name=tiny_grpo \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.val_before_train=False \
    trainer.total_training_steps=1 $@
