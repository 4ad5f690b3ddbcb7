"""Stand-ins for what :class:`rlcore.checkpoint.Checkpointer` saves, so tests of the checkpoint
format (integrity, disk-full handling, retention) need no real model or tokenizer."""

from __future__ import annotations

import os


class FakeActor:
    """What ``Checkpointer.save`` needs of the actor: a Hugging Face style ``save_pretrained``
    writing ``model.safetensors`` from ``module``'s state."""

    def __init__(self, module):
        self.module = module

    def save_pretrained(self, path, safe_serialization=True, **_):
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        save_file(
            {k: v.contiguous() for k, v in self.module.state_dict().items()},
            os.path.join(path, "model.safetensors"),
        )


class FakeTokenizer:
    """A tokenizer whose ``save_pretrained`` writes one small ``tokenizer.json``."""

    def save_pretrained(self, path):
        with open(os.path.join(path, "tokenizer.json"), "w") as f:
            f.write('{"tokens": []}')


def tiny_training_state(seed: int = 0, width: int = 64):
    """A ``width`` x ``width`` linear model one AdamW step in, with its optimizer and a constant
    scheduler: what a checkpoint holds of a real run, seeded so each step differs."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Linear(width, width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return model, optimizer, scheduler


def save_tiny_checkpoint(checkpointer, step: int, width: int = 64):
    """``checkpointer.save`` of :func:`tiny_training_state` seeded by ``step``; the checkpoint's path."""
    model, optimizer, scheduler = tiny_training_state(step, width)
    return checkpointer.save(
        step,
        actor=FakeActor(model),
        tokenizer=FakeTokenizer(),
        optimizers={"actor": optimizer},
        schedulers={"actor": scheduler},
        modules={},
        state={"data": {"epoch": 0, "offset": step}},
    )
