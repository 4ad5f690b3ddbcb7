"""Server mode over real HTTP against a fake SGLang server (tests/sglang_fake_server.py) that
answers in SGLang 0.5.23's documented shapes, backed by a tiny real model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from rlcore_rollout_sglang.engine import build  # noqa: E402
from rlcore_rollout_sglang.names import names  # noqa: E402
from rlcore_rollout_sglang.options import SGLangOptions  # noqa: E402
from sglang_fake_server import VOCAB, BigramEngine, BigramLM, FakeSGLang, ThreadServer, free_port  # noqa: E402

from rlcore.engine_kit.remote import RejectedError  # noqa: E402
from rlcore.errors import RlcoreError  # noqa: E402
from rlcore.interfaces import SamplingParams  # noqa: E402
from rlcore.testing.engines import check_rollout_engine  # noqa: E402


def _serve(**kw) -> ThreadServer:
    return ThreadServer(FakeSGLang(BigramEngine(BigramLM()), **kw))


@pytest.fixture
def server():
    s = _serve()
    yield s
    s.close()


def _engine(*urls, **kw):
    kw.setdefault("connect_timeout_s", 2)
    kw.setdefault("request_timeout_s", 20)
    return build(SGLangOptions(mode="server", servers=list(urls), **kw), None)


def _expected(prompts, params, model=None):
    """What SGLang (here: the same model and sampler) gives for these prompts: the ground truth."""
    return BigramEngine(model or BigramLM()).generate(prompts, params)


def _tokens(groups):
    return [[c.token_ids for c in g] for g in groups]


def test_generate_sends_sglang_requests_and_parses_answers_in_prompt_order(server):
    engine = _engine(server.url)
    prompts = [[1, 2, 3], [9], [4, 4]]
    params = SamplingParams(n=3, temperature=0.8, top_k=20, max_new_tokens=6, stop_token_ids=[5], seed=7)
    out = engine.generate(prompts, params)
    want = _expected(prompts, params)
    assert _tokens(out) == _tokens(want)
    assert [[c.logprobs for c in g] for g in out] == [[c.logprobs for c in g] for g in want]
    assert [[c.finish_reason for c in g] for g in out] == [[c.finish_reason for c in g] for g in want]
    sent = [b for p, b in server.fake.calls if p == "/generate"]
    assert len(sent) == 3 and all(b["return_logprob"] is True for b in sent)
    assert sorted(b["input_ids"][0] for b in sent) == sorted(prompts)
    assert all(set(b["sampling_params"]) <= names("sampling-params") for b in sent)
    assert sent[0]["sampling_params"]["sampling_seed"] == 7 and sent[0]["sampling_params"]["top_k"] == 20
    greedy = engine.generate([[5]], SamplingParams(n=4, temperature=0.0, max_new_tokens=4))[0]
    assert len(greedy) == 4 and len({tuple(c.token_ids) for c in greedy}) == 1
    assert server.fake.calls[-1][1]["sampling_params"]["n"] == 1  # one greedy sample, copied
    assert engine.generate([[1]], SamplingParams(top_k=-1, max_new_tokens=1))[0][
        0
    ].token_ids  # top_k -1 accepted


def test_conformance_kit_passes_with_the_reference_model(server, tmp_path):
    engine = _engine(server.url, weight_sync_dir=str(tmp_path), server_sleep=True)
    reference = BigramLM()  # the same weights as the server's model
    results = check_rollout_engine(engine, vocab_size=VOCAB, reference_model=reference, logprob_atol=1e-5)
    assert results.pop("stop_strings") == "skipped: no tokenizer given"
    assert all(r == "passed" for r in results.values()), results
    paths = [p for p, _ in server.fake.calls]
    assert "/release_memory_occupation" in paths and "/update_weights_from_disk" in paths


def test_unreachable_server_is_named():
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RlcoreError, match=dead.replace(".", r"\.")):
        _engine(dead)


def test_failed_requests_are_retried_whole_on_another_server_and_the_server_rejoins(server):
    flaky = _serve(fail_generate=1)
    try:
        engine = _engine(flaky.url, server.url, max_concurrency=2)
        prompts = [[i + 1] for i in range(6)]
        params = SamplingParams(n=2, temperature=1.0, max_new_tokens=5, seed=3)
        out = engine.generate(prompts, params)
        assert _tokens(out) == _tokens(_expected(prompts, params))  # no sample lost or changed
        assert flaky.url in engine.pool.down and "HTTP 500" in engine.pool.down[flaky.url]
        served = len(flaky.fake.calls)
        engine.generate([[1]], SamplingParams(max_new_tokens=1))  # /health answers again: it rejoins
        assert flaky.url not in engine.pool.down and len(flaky.fake.calls) == served + 1
    finally:
        flaky.close()


def test_server_killed_mid_rollout_loses_no_sample(server, tmp_path):
    port = free_port()
    script = Path(__file__).parent / "sglang_fake_server.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(port), "--delay", "0.4"], env=env, start_new_session=True
    )
    victim = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(victim + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline and proc.poll() is None, "the fake server process did not start"
            time.sleep(0.2)
        engine = _engine(victim, server.url, max_concurrency=8)
        prompts = [[i + 1, i + 2] for i in range(12)]
        params = SamplingParams(n=3, temperature=1.0, max_new_tokens=6, seed=11)
        killer = threading.Timer(
            0.2, lambda: os.killpg(proc.pid, signal.SIGKILL)
        )  # requests are in flight there
        killer.start()
        out = engine.generate(prompts, params)
        killer.join()
        assert proc.wait(10) == -signal.SIGKILL
        assert _tokens(out) == _tokens(_expected(prompts, params))
        assert victim in engine.pool.down
        assert sum(p == "/generate" for p, _ in server.fake.calls) >= 12  # the victim answered none
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_a_dying_server_with_no_other_left_fails_naming_it():
    flaky = _serve(fail_generate=100)
    try:
        engine = _engine(flaky.url)
        with pytest.raises(RlcoreError) as info:
            engine.generate([[1]], SamplingParams(max_new_tokens=2))
        assert flaky.url in str(info.value) and "HTTP 500" in str(info.value)
    finally:
        flaky.close()


def test_a_refused_request_is_reported_not_retried(server):
    other = _serve()
    try:
        engine = _engine(server.url, other.url)
        engine.lora_name = "never-loaded"
        with pytest.raises(RejectedError, match="is not loaded"):
            engine.generate([[1]], SamplingParams(max_new_tokens=2))
        assert engine.pool.down == {}
        assert sum(p == "/generate" for p, _ in server.fake.calls + other.fake.calls) == 1
    finally:
        other.close()


def test_full_weight_update_through_disk_changes_generation(server, tmp_path):
    engine = _engine(server.url, weight_sync_dir=str(tmp_path / "sync"), weight_bucket_mb=1)
    new = BigramLM(seed=5)
    state = {"table.weight": new.table.weight.detach().clone()}
    engine.update_weights(state.items())
    body = [b for p, b in server.fake.calls if p == "/update_weights_from_disk"][0]
    index = json.loads((Path(body["model_path"]) / "model.safetensors.index.json").read_text())
    assert (
        index["weight_map"] == {"table.weight": "model-00001.safetensors"} and body["weight_version"] == "1"
    )
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    assert _tokens(engine.generate([[3], [7]], params)) == _tokens(_expected([[3], [7]], params, new))
    engine.update_weights(state.items())
    assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == [
        "weights-v2"
    ]  # the old version is removed
    # Buckets: two 1.2 MB tensors with 1 MB buckets give two shards.
    big = {"a.weight": torch.zeros(600, 512), "b.weight": torch.zeros(600, 512)}
    from rlcore.engine_kit.weights import write_shards

    assert len(write_shards(big.items(), tmp_path / "ck", 1 << 20)) == 2


def test_rejected_weight_update_names_the_server_and_the_reason(tmp_path):
    bad = _serve(reject_updates=True)
    try:
        engine = _engine(bad.url, weight_sync_dir=str(tmp_path))
        with pytest.raises(RlcoreError) as info:
            engine.update_weights([("table.weight", torch.zeros(VOCAB, VOCAB))])
        assert bad.url in str(info.value) and "size mismatch" in str(info.value)
    finally:
        bad.close()


def test_wrong_weight_names_are_refused_by_the_server(server, tmp_path):
    engine = _engine(server.url, weight_sync_dir=str(tmp_path))
    with pytest.raises(RejectedError) as info:
        engine.update_weights([("lm_head.weight", torch.zeros(2, 2))])
    assert "lm_head.weight" in str(info.value) and server.url in str(info.value)


def test_lora_update_loads_the_adapter_and_generates_with_it(server, tmp_path):
    engine = _engine(server.url, weight_sync_dir=str(tmp_path))
    lora = {"rank": 4, "alpha": 8, "target_modules": ["q_proj"]}
    adapter = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 8)}
    engine.update_weights(adapter.items(), lora=lora)
    engine.update_weights(adapter.items(), lora=lora)
    loads = [b for p, b in server.fake.calls if p == "/load_lora_adapter"]
    assert [b["lora_name"] for b in loads] == ["rlcore-lora-v1", "rlcore-lora-v2"]
    assert json.loads((Path(loads[1]["lora_path"]) / "adapter_config.json").read_text())["r"] == 4
    assert [b["lora_name"] for p, b in server.fake.calls if p == "/unload_lora_adapter"] == ["rlcore-lora-v1"]
    engine.generate([[1]], SamplingParams(max_new_tokens=2))
    assert server.fake.calls[-1][1]["lora_path"] == ["rlcore-lora-v2"]
    with pytest.raises(RlcoreError, match="only LoRA adapter tensors"):
        engine.update_weights([("table.weight", torch.zeros(1))], lora=lora)


def test_sleep_releases_memory_and_an_update_while_asleep_wakes_only_the_weights(server, tmp_path):
    engine = _engine(server.url, weight_sync_dir=str(tmp_path), server_sleep=True)
    engine.sleep()
    engine.update_weights([("table.weight", BigramLM().table.weight.detach())])
    engine.wake_up()
    calls = [(p, b.get("tags")) for p, b in server.fake.calls if "memory" in p or "weights" in p]
    assert calls == [
        ("/release_memory_occupation", None),
        ("/resume_memory_occupation", ["weights"]),
        ("/update_weights_from_disk", None),
        ("/resume_memory_occupation", ["kv_cache", "cuda_graph"]),
    ]
    assert server.fake.released == set()
    assert engine.generate([[2]], SamplingParams(max_new_tokens=2))[0][0].token_ids
    quiet = _engine(server.url)  # server_sleep off: sleep() leaves the servers alone
    quiet.sleep()
    assert server.fake.calls[-1][0] == "/generate"


def test_update_without_sync_dir_is_a_usage_error(server):
    with pytest.raises(RlcoreError, match="weight_sync_dir"):
        _engine(server.url).update_weights([("table.weight", torch.zeros(1))])
