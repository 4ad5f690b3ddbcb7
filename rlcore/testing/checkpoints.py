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
        save_file({k: v.contiguous() for k, v in self.module.state_dict().items()}, os.path.join(path, "model.safetensors"))


class FakeTokenizer:
    """A tokenizer whose ``save_pretrained`` writes one small ``tokenizer.json``."""

    def save_pretrained(self, path):
        with open(os.path.join(path, "tokenizer.json"), "w") as f:
            f.write('{"tokens": []}')
