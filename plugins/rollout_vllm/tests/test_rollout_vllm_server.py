"""Server mode over real HTTP: against ``rlcore serve`` (same /v1/completions subset as vLLM) and
against a fixture server answering in vLLM's documented formats (endpoints of 0.26 to 0.33)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import torch
from rlcore_rollout_vllm.engine import build
from rlcore_rollout_vllm.options import VLLMOptions
from rlcore_rollout_vllm.weights import LoraSpec

from rlcore.errors import RlcoreError
from rlcore.interfaces import SamplingParams


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- vLLM fixture


class FakeVLLM:
    """Answers like ``vllm serve``: /v1/completions with token-id prompts, ``return_token_ids`` and
    ``return_tokens_as_token_ids``; the dev-mode endpoints; LoRA load/unload. Tokens are a
    deterministic function of the prompt, so every answer can be checked."""

    def __init__(self, die_after: int | None = None, reject_rpc: bool = False):
        self.calls: list[tuple[str, dict]] = []
        self.die_after = die_after
        self.reject_rpc = reject_rpc
        self.loras: set[str] = set()
        self.completions = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, body=None):
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                path = urlparse(self.path).path
                if path == "/health":
                    return self._send(200)
                if path == "/v1/models":
                    return self._send(
                        200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
                    )
                self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.calls.append((url.path, {**body, **{k: v[0] for k, v in parse_qs(url.query).items()}}))
                if url.path == "/v1/completions":
                    fake.completions += 1
                    if fake.die_after is not None and fake.completions > fake.die_after:
                        self.connection.close()  # the server "dies": no answer at all
                        return
                    if body["model"] not in {"fake-model", *fake.loras}:
                        return self._send(
                            404,
                            {
                                "error": {
                                    "message": f"The model `{body['model']}` does not exist.",
                                    "code": 404,
                                }
                            },
                        )
                    return self._send(200, fake.complete(body))
                if url.path == "/collective_rpc":
                    if fake.reject_rpc:
                        return self._send(
                            500,
                            {
                                "error": {
                                    "message": "Call to collective_rpc method failed: size mismatch",
                                    "code": 500,
                                }
                            },
                        )
                    return self._send(200, {"results": [None]})
                if url.path in ("/sleep", "/wake_up", "/reset_prefix_cache"):
                    return self._send(200)
                if url.path == "/v1/load_lora_adapter":
                    fake.loras.add(body["lora_name"])
                    return self._send(200, f"Success: LoRA adapter '{body['lora_name']}' added successfully.")
                if url.path == "/v1/unload_lora_adapter":
                    fake.loras.discard(body["lora_name"])
                    return self._send(200, "Success")
                self._send(404, {"detail": "Not Found"})

        self.server = ThreadingHTTPServer(("127.0.0.1", _free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def complete(body: dict) -> dict:
        prompt = body["prompt"]
        choices = []
        for j in range(body["n"]):
            ids = [
                (sum(prompt) * 7 + 13 * k + 31 * j * (body.get("temperature", 1) > 0)) % 500
                for k in range(body["max_tokens"])
            ]
            finish = "length"
            for k, t in enumerate(ids):
                if t in body.get("stop_token_ids", []):
                    ids, finish = ids[: k + 1], "stop"
                    break
            choices.append(
                {
                    "index": j,
                    "text": "",
                    "finish_reason": finish,
                    "stop_reason": None,
                    "token_ids": ids,
                    "prompt_token_ids": prompt,
                    "logprobs": {
                        "text_offset": list(range(len(ids))),
                        "token_logprobs": [-0.5 - 0.01 * t for t in ids],
                        "tokens": [f"token_id:{t}" for t in ids],
                        "top_logprobs": [{f"token_id:{t}": -0.5} for t in ids],
                    },
                }
            )
        return {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 0,
            "model": body.get("model", ""),
            "choices": choices,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": 0, "total_tokens": 0},
        }

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    server = FakeVLLM()
    yield server
    server.close()


def _engine(*urls, **kw):
    return build(
        VLLMOptions(mode="server", servers=list(urls), connect_timeout_s=2, request_timeout_s=10, **kw), None
    )


def test_generate_parses_vllm_answers_in_prompt_order(fake):
    engine = _engine(fake.url)
    prompts = [[1, 2, 3], [9], [4, 4]]
    out = engine.generate(
        prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=5, stop_token_ids=[20])
    )
    for prompt, group in zip(prompts, out):
        for j, c in enumerate(group):
            want = FakeVLLM.complete(
                {"prompt": prompt, "n": 2, "max_tokens": 5, "temperature": 1.0, "stop_token_ids": [20]}
            )["choices"][j]
            assert c.token_ids == want["token_ids"] and c.logprobs == want["logprobs"]["token_logprobs"]
            assert c.finish_reason == want["finish_reason"]
    sent = [b for p, b in fake.calls if p == "/v1/completions"][0]
    assert sent["return_token_ids"] and sent["return_tokens_as_token_ids"] and sent["logprobs"] == 1
    assert sent["model"] == "fake-model"
    greedy = engine.generate([[5]], SamplingParams(n=3, temperature=0.0, max_new_tokens=3))[0]
    assert len(greedy) == 3 and greedy[0].token_ids == greedy[2].token_ids
    assert [b for p, b in fake.calls if p == "/v1/completions"][-1]["n"] == 1


def test_unreachable_server_is_named():
    dead = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(RlcoreError, match=dead.replace(".", r"\.")):
        _engine(dead)


def test_requests_of_a_dying_server_are_retried_elsewhere_without_losing_samples(fake):
    dying = FakeVLLM(die_after=1)
    try:
        engine = _engine(dying.url, fake.url, max_concurrency=1)
        prompts = [[i] for i in range(6)]
        out = engine.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=4))
        assert [len(g) for g in out] == [3] * 6
        assert [c.token_ids for c in out[5]] == [
            FakeVLLM.complete({"prompt": [5], "n": 3, "max_tokens": 4})["choices"][j]["token_ids"]
            for j in range(3)
        ]
        assert dying.url in engine.pool.down
    finally:
        dying.close()


def test_a_server_dying_with_no_other_left_fails_naming_it():
    dying = FakeVLLM(die_after=0)
    try:
        engine = _engine(dying.url)
        with pytest.raises(RlcoreError) as info:
            engine.generate([[1]], SamplingParams(max_new_tokens=2))
        assert dying.url in str(info.value)
    finally:
        dying.close()


def test_full_weight_update_writes_shards_and_reloads(fake, tmp_path):
    engine = _engine(fake.url, weight_sync_dir=str(tmp_path), weight_bucket_mb=1, server_sleep=True)
    engine.sleep()
    engine.wake_up()
    weights = {"model.embed_tokens.weight": torch.randn(600, 512), "lm_head.weight": torch.randn(600, 512)}
    engine.update_weights(weights.items())
    paths = [p for p, _ in fake.calls]
    assert (
        paths[:2] == ["/sleep", "/wake_up"]
        and "/collective_rpc" in paths
        and paths[-1] == "/reset_prefix_cache"
    )
    rpc = [b for p, b in fake.calls if p == "/collective_rpc"][0]
    assert rpc["method"] == "reload_weights"
    shards = sorted(Path(rpc["kwargs"]["weights_path"]).glob("*.safetensors"))
    assert len(shards) == 2  # 1.2 MB each, 1 MB buckets
    from safetensors.torch import load_file

    loaded = {k: v for s in shards for k, v in load_file(str(s)).items()}
    assert all(torch.equal(loaded[k], v) for k, v in weights.items())


def test_rejected_weight_update_names_the_server(tmp_path):
    server = FakeVLLM(reject_rpc=True)
    try:
        engine = _engine(server.url, weight_sync_dir=str(tmp_path))
        with pytest.raises(RlcoreError) as info:
            engine.update_weights([("lm_head.weight", torch.zeros(2, 2))])
        assert server.url in str(info.value) and "size mismatch" in str(info.value)
    finally:
        server.close()


def test_lora_update_loads_adapter_and_generates_with_it(fake, tmp_path):
    engine = _engine(fake.url, weight_sync_dir=str(tmp_path))
    spec = LoraSpec(rank=4, alpha=8, target_modules=["q_proj"])
    adapter = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 8)}
    engine.update_weights(adapter.items(), lora=spec)
    engine.update_weights(adapter.items(), lora=spec)
    loads = [b for p, b in fake.calls if p == "/v1/load_lora_adapter"]
    assert [b["lora_name"] for b in loads] == ["rlcore-lora-v1", "rlcore-lora-v2"]
    assert json.loads((Path(loads[1]["lora_path"]) / "adapter_config.json").read_text())["r"] == 4
    assert [b["lora_name"] for p, b in fake.calls if p == "/v1/unload_lora_adapter"] == ["rlcore-lora-v1"]
    engine.generate([[1]], SamplingParams(max_new_tokens=2))
    assert [b for p, b in fake.calls if p == "/v1/completions"][-1]["model"] == "rlcore-lora-v2"
    with pytest.raises(RlcoreError, match="only LoRA adapter tensors"):
        engine.update_weights([("lm_head.weight", torch.zeros(1))], lora=spec)


def test_update_without_sync_dir_is_a_usage_error(fake):
    with pytest.raises(RlcoreError, match="weight_sync_dir"):
        _engine(fake.url).update_weights([("lm_head.weight", torch.zeros(1))])


# ----------------------------------------------------------------------------- rlcore serve


@pytest.mark.slow
def test_conformance_against_rlcore_serve(tmp_path):
    serve_app = pytest.importorskip("rlcore_serve.app")  # rlcore-serve, when installed beside
    uvicorn = pytest.importorskip("uvicorn")
    hf_engine = pytest.importorskip("rlcore_rollout_hf.engine")
    from rlcore_rollout_hf.options import HFEngineOptions
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlcore.interfaces import BuildContext
    from rlcore.testing.engines import check_rollout_engine
    from rlcore.testing.models import make_tiny_model

    path = make_tiny_model(tmp_path / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    engine = hf_engine.build(HFEngineOptions(), BuildContext(actor=model, tokenizer=tokenizer, device="cpu"))
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            serve_app.create_app(engine, tokenizer, model_name="tiny"), port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        client = _engine(f"http://127.0.0.1:{port}")
        assert client.model == "tiny"
        results = check_rollout_engine(
            client, vocab_size=len(tokenizer), reference_model=model, check_update_weights=False
        )
        assert results["reference_logprobs"] == "passed" and results["structure"] == "passed"
    finally:
        server.should_exit = True
        thread.join(10)
