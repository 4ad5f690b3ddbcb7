"""A fake SGLang server for CI: SGLang 0.5.23's native HTTP API, backed by a tiny real model.

It replays the request and answer shapes of ``sglang.launch_server`` (``/generate`` with
``input_ids``/``sampling_params``/``return_logprob``/``lora_path``, flat prompt-major answers
with ``output_ids`` and ``meta_info.output_token_logprobs`` as ``[logprob, token_id, text]``,
``finish_reason`` objects, ``/health``, ``/update_weights_from_disk`` answering
``{"success", "message", "num_paused_requests"}`` with 400 on failure, ``/load_lora_adapter``,
``/unload_lora_adapter``, ``/release_memory_occupation``, ``/resume_memory_occupation``), and
refuses sampling parameters that SGLang 0.5.23 does not have.

Behind it is :class:`BigramLM`, a one-table language model (next-token logits depend on the last
token only) with SGLang's sampling semantics: log-probs are ``log_softmax(logits / T)`` of the
sampled token before top-k/top-p, temperature 0 is greedy with ``T = 1``, ``sampling_seed`` makes
samples reproducible. Being a torch module it is also the conformance kit's reference model, and
``/update_weights_from_disk`` really loads the safetensors it is pointed at.

Run alone (for kill tests): ``python sglang_fake_server.py PORT [--delay S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import math
import os
import socket
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from rlcore_rollout_sglang.names import names

from rlcore.interfaces import Completion, SamplingParams

VOCAB = 97


class BigramLM(torch.nn.Module):
    """Next-token logits = a learned row per previous token: tiny, fast and exactly checkable."""

    def __init__(self, vocab: int = VOCAB, seed: int = 0):
        super().__init__()
        self.table = torch.nn.Embedding(vocab, vocab)
        with torch.no_grad():
            self.table.weight.copy_(
                torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * 2.0
            )

    def forward(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=self.table(input_ids))


class BigramEngine:
    """Samples from a :class:`BigramLM` the way SGLang's sampler does (see the module docstring)."""

    def __init__(self, model: BigramLM):
        self.model = model
        self.asleep = False

    def _sample(self, prompt: list[int], params: SamplingParams, j: int) -> Completion:
        gen = torch.Generator()
        if params.seed is not None:
            gen.manual_seed(hash((params.seed, tuple(prompt), j)) % (2**62))
        else:
            gen.seed()
        greedy = params.temperature == 0
        temperature = 1.0 if greedy else params.temperature
        top_k = 1 if greedy else params.top_k
        last, ids, lps, finish = prompt[-1], [], [], "length"
        with torch.no_grad():
            for _ in range(params.max_new_tokens):
                logp = torch.log_softmax(self.model.table.weight[last].float() / temperature, dim=-1)
                if top_k == 1:
                    token = int(torch.argmax(logp))
                else:
                    probs = logp.exp()
                    if top_k > 0:
                        probs = torch.where(probs >= torch.topk(probs, top_k).values[-1], probs, 0.0)
                    if params.top_p < 1.0:
                        ordered, order = torch.sort(probs, descending=True)
                        drop = (torch.cumsum(ordered, 0) - ordered) > params.top_p * ordered.sum()
                        probs = probs.clone()
                        probs[order[drop]] = 0.0
                    token = int(torch.multinomial(probs, 1, generator=gen))
                ids.append(token)
                lps.append(float(logp[token]))
                last = token
                if token in params.stop_token_ids:
                    finish = "stop"
                    break
        return Completion(ids, lps, finish)

    def generate(self, prompts, params: SamplingParams) -> list[list[Completion]]:
        if self.asleep:
            raise RuntimeError("generate while the memory is released")
        return [[self._sample(list(p), params, j) for j in range(params.n)] for p in prompts]

    def update_weights(self, named_tensors) -> None:
        own = dict(self.model.named_parameters())
        loaded = dict(named_tensors)
        unknown = sorted(set(loaded) - set(own))
        if unknown:
            raise KeyError(f"no parameter named {unknown[0]!r} in the model")
        for name, tensor in loaded.items():
            if tuple(tensor.shape) != tuple(own[name].shape):
                raise ValueError(
                    f"{name}: shape {tuple(tensor.shape)} does not match {tuple(own[name].shape)}"
                )
        with torch.no_grad():
            for name, tensor in loaded.items():
                own[name].copy_(tensor)

    def sleep(self) -> None:
        self.asleep = True

    def wake_up(self) -> None:
        self.asleep = False


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


class FakeSGLang:
    """The app plus what a test wants to look at or break."""

    def __init__(
        self, engine: Any, *, delay_s: float = 0.0, reject_updates: bool = False, fail_generate: int = 0
    ):
        self.engine = engine
        self.delay_s = delay_s
        self.reject_updates = reject_updates
        self.fail_generate = fail_generate  # answer this many /generate calls with HTTP 500 first
        self.calls: list[tuple[str, dict]] = []
        self.loras: dict[str, str] = {}
        self.released: set[str] = set()
        self.weight_version = "default"
        self.app = self._build()

    def _build(self) -> FastAPI:
        app = FastAPI()
        fake = self
        sampling_names = names("sampling-params")

        @app.get("/health")
        async def health():
            return Response(status_code=200)

        @app.post("/generate")
        async def generate(request: Request):
            body = await request.json()
            fake.calls.append(("/generate", body))
            if fake.fail_generate > 0:
                fake.fail_generate -= 1
                return _error("internal error (injected)", 500)
            if fake.delay_s:
                await asyncio.sleep(fake.delay_s)
            sp = dict(body.get("sampling_params") or {})
            unknown = sorted(set(sp) - sampling_names)
            if unknown:
                return _error(f"SamplingParams.__init__() got an unexpected keyword argument {unknown[0]!r}")
            top_k = sp.get("top_k", -1)
            if top_k < 1 and top_k != -1:
                return _error(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
            ids = body["input_ids"]
            single = bool(ids) and isinstance(ids[0], int)
            prompts = [ids] if single else ids
            lora = body.get("lora_path")
            for name in [lora] if isinstance(lora, str) else lora or []:
                if name is not None and name not in fake.loras:
                    return _error(f"LoRA adapter {name!r} is not loaded")
            params = SamplingParams(
                n=sp.get("n", 1),
                temperature=sp.get("temperature", 1.0),
                top_p=sp.get("top_p", 1.0),
                top_k=top_k,
                max_new_tokens=sp.get("max_new_tokens", 128),
                stop_token_ids=sp.get("stop_token_ids") or [],
                stop=[sp["stop"]] if isinstance(sp.get("stop"), str) else sp.get("stop") or [],
                seed=sp.get("sampling_seed"),
            )
            try:
                groups = fake.engine.generate(prompts, params)
            except Exception as exc:  # noqa: BLE001 - the fake reports what its model refused
                return _error(f"{type(exc).__name__}: {exc}", 500)
            out = [fake._answer(p, c, params) for p, group in zip(prompts, groups) for c in group]
            return JSONResponse(out[0] if single and params.n == 1 else out)

        @app.post("/update_weights_from_disk")
        async def update_weights_from_disk(request: Request):
            body = await request.json()
            fake.calls.append(("/update_weights_from_disk", body))
            if fake.reject_updates:
                return fake._update_answer(
                    False, "Failed to update weights: size mismatch for lm_head.weight (injected)"
                )
            if "weights" in fake.released:
                return fake._update_answer(False, "Failed to update weights: the weights are released")
            files = sorted(glob.glob(os.path.join(body["model_path"], "*.safetensors")))
            if not files:
                return fake._update_answer(
                    False, f"Failed to get weights iterator: no safetensors in {body['model_path']}."
                )
            from safetensors.torch import load_file

            try:
                fake.engine.update_weights([kv for f in files for kv in load_file(f).items()])
            except (KeyError, ValueError) as exc:
                return fake._update_answer(
                    False, f"Failed to update weights: {exc}.\nRolling back to original weights."
                )
            fake.weight_version = body.get("weight_version") or fake.weight_version
            return fake._update_answer(True, "Succeeded to update model weights.")

        @app.post("/load_lora_adapter")
        async def load_lora_adapter(request: Request):
            body = await request.json()
            fake.calls.append(("/load_lora_adapter", body))
            if not os.path.exists(os.path.join(body["lora_path"], "adapter_config.json")):
                return JSONResponse(
                    {
                        "success": False,
                        "error_message": f"no adapter at {body['lora_path']}",
                        "loaded_adapters": fake.loras,
                    },
                    400,
                )
            fake.loras[body["lora_name"]] = body["lora_path"]
            return JSONResponse({"success": True, "error_message": None, "loaded_adapters": fake.loras})

        @app.post("/unload_lora_adapter")
        async def unload_lora_adapter(request: Request):
            body = await request.json()
            fake.calls.append(("/unload_lora_adapter", body))
            fake.loras.pop(body["lora_name"], None)
            return JSONResponse({"success": True, "error_message": None, "loaded_adapters": fake.loras})

        @app.post("/release_memory_occupation")
        async def release(request: Request):
            body = await request.json()
            fake.calls.append(("/release_memory_occupation", body))
            fake.released |= set(body.get("tags") or ["kv_cache", "weights", "cuda_graph"])
            fake.engine.sleep()
            return JSONResponse(None)

        @app.post("/resume_memory_occupation")
        async def resume(request: Request):
            body = await request.json()
            fake.calls.append(("/resume_memory_occupation", body))
            fake.released -= set(body.get("tags") or ["kv_cache", "weights", "cuda_graph"])
            if not fake.released:
                fake.engine.wake_up()
            return JSONResponse(None)

        return app

    def _update_answer(self, success: bool, message: str) -> JSONResponse:
        return JSONResponse(
            {"success": success, "message": message, "num_paused_requests": 0}, 200 if success else 400
        )

    def _answer(self, prompt: list[int], c: Completion, params: SamplingParams) -> dict[str, Any]:
        if c.finish_reason == "stop":
            matched: Any = (
                c.token_ids[-1]
                if c.token_ids and c.token_ids[-1] in params.stop_token_ids
                else (params.stop or [""])[0]
            )
            finish = {"type": "stop", "matched": matched}
        else:
            finish = {"type": "length", "length": len(c.token_ids)}
        for lp in c.logprobs:
            assert math.isfinite(lp)
        return {
            "text": "",
            "output_ids": list(c.token_ids),
            "meta_info": {
                "id": uuid.uuid4().hex,
                "finish_reason": finish,
                "prompt_tokens": len(prompt),
                "weight_version": self.weight_version,
                "completion_tokens": len(c.token_ids),
                "cached_tokens": 0,
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(c.logprobs, c.token_ids)],
            },
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadServer:
    """Serve a FakeSGLang on 127.0.0.1 in a background thread (uvicorn)."""

    def __init__(self, fake: FakeSGLang):
        import uvicorn

        self.fake = fake
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(
            uvicorn.Config(fake.app, host="127.0.0.1", port=self.port, log_level="error")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("the fake SGLang server did not start")
            time.sleep(0.02)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    fake = FakeSGLang(BigramEngine(BigramLM()), delay_s=args.delay)
    uvicorn.run(fake.app, host="127.0.0.1", port=args.port, log_level="error")


if __name__ == "__main__":
    main()
