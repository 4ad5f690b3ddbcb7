"""Real SGLang on a GPU (``pytest -m sglang``): colocated and server mode against transformers.

Runs only where ``sglang`` imports and CUDA is present. NEVER RUN YET: no machine this plugin was
written on could run SGLang (see the README). A small random Qwen2 in bfloat16 is saved as a
Hugging Face directory; both modes go through rlcore's conformance kit with that model as the
reference (bfloat16 tolerances), then load different weights and must follow them greedily.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.sglang, pytest.mark.gpu, pytest.mark.slow]


def _sglang_and_gpu() -> bool:
    if importlib.util.find_spec("sglang") is None:
        return False
    import torch

    return torch.cuda.is_available()


skip = pytest.mark.skipif(not _sglang_and_gpu(), reason="needs SGLang and a CUDA GPU")
ATOL, MARGIN = 0.1, 0.1  # bfloat16 kernels differ from transformers' by this much


def _model(path, seed):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)  # clear argmax margins: greedy is stable across kernels
    if path is not None:
        model.save_pretrained(path, safe_serialization=True)
        tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(cfg.vocab_size)}, unk_token="t0"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        PreTrainedTokenizerFast(
            tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2"
        ).save_pretrained(path)
    return model.cuda().eval()


def _exercise(engine, reference, other):
    """The kit with ``reference``; then ``other``'s weights, which greedy decoding must follow."""
    from rlcore.testing.engines import check_reference_greedy, check_rollout_engine, default_prompts, greedy

    results = check_rollout_engine(
        engine, vocab_size=2048, reference_model=reference, logprob_atol=ATOL, greedy_margin=MARGIN
    )
    assert all(r == "passed" or r.startswith("skipped: no tokenizer") for r in results.values()), results
    engine.sleep()
    engine.update_weights(list(other.state_dict().items()))
    engine.wake_up()
    prompts = default_prompts(2048)
    check_reference_greedy(engine, prompts, greedy(engine, prompts, 16), other, MARGIN)


@skip
def test_sglang_colocated_generate_sleep_wake_update(tmp_path):
    from rlcore_rollout_sglang.engine import build
    from rlcore_rollout_sglang.options import SGLangOptions

    from rlcore.interfaces import BuildContext

    reference = _model(tmp_path / "m", seed=0)
    other = _model(None, seed=1)
    engine = build(
        SGLangOptions(
            mem_fraction_static=0.3,
            dtype="bfloat16",
            disable_cuda_graph=True,
            weight_bucket_mb=4,
            engine_args={"enable_deterministic_inference": True},
        ),  # honours sampling_seed
        BuildContext(model_path=str(tmp_path / "m"), dtype="bfloat16"),
    )
    try:
        _exercise(engine, reference, other)
    finally:
        engine.close()


@skip
def test_sglang_server_generate_sleep_wake_update(tmp_path):
    import httpx
    from rlcore_rollout_sglang.engine import build
    from rlcore_rollout_sglang.options import SGLangOptions

    reference = _model(tmp_path / "m", seed=0)
    other = _model(None, seed=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(tmp_path / "m"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--mem-fraction-static",
        "0.3",
        "--enable-memory-saver",
        "--disable-cuda-graph",
        "--enable-deterministic-inference",
    ]
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 600
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-4000:]
            assert time.time() < deadline, "sglang.launch_server did not become healthy in 600 s"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        engine = build(
            SGLangOptions(
                mode="server", servers=[url], weight_sync_dir=str(tmp_path / "sync"), server_sleep=True
            ),
            None,
        )
        _exercise(engine, reference, other)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
