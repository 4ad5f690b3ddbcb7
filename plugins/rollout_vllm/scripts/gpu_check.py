"""End-to-end check of the vllm engine on a GPU: colocated (generate, sleep, wake, full and LoRA
weight updates) and server mode against a real ``vllm serve``, each compared with the trainer's
own model (transformers, same weights). Writes ``results.json`` and a log into OUT.

    python plugins/rollout_vllm/scripts/gpu_check.py OUT_DIR

Used by ``tests/test_rollout_vllm_gpu.py`` (``pytest -m vllm``) and run as is on the GPU machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import torch

RESULTS: dict = {"checks": {}, "errors": {}}
PROMPT_LEN, NEW = 12, 16


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def check(name, ok, **info):
    RESULTS["checks"][name] = {"ok": bool(ok), **info}
    log("CHECK", name, "OK" if ok else "FAIL", json.dumps(info)[:400])


def make_model_dir(path, seed=0):
    """A small Qwen2 with random but peaked weights, and a word-level tokenizer, saved as HF."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False, initializer_range=0.1,
        bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16",
    )
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():  # a larger output head gives clear argmax margins, so greedy is stable across kernels
        model.lm_head.weight.mul_(4.0)
    model.save_pretrained(path, safe_serialization=True)
    vocab = {f"t{i}": i for i in range(cfg.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2").save_pretrained(path)
    return model


def hf_greedy(model, prompts, new=NEW):
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p], device=model.device)
            g = model.generate(ids, do_sample=False, max_new_tokens=new, min_new_tokens=new, eos_token_id=None, pad_token_id=0)
            out.append(g[0, len(p):].tolist())
    return out


def hf_logprobs(model, prompt, response):
    with torch.no_grad():
        ids = torch.tensor([list(prompt) + list(response)], device=model.device)
        logits = model(ids).logits.float()[0, len(prompt) - 1 : -1]
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response, device=model.device)[:, None])[:, 0].tolist()


def match(a, b):
    """Fraction of sequences identical, and fraction of positions identical."""
    seq = sum(x == y for x, y in zip(a, b)) / len(a)
    pos = sum(sum(p == q for p, q in zip(x, y)) for x, y in zip(a, b)) / sum(len(x) for x in a)
    return seq, pos


def perturb(model, scale, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.add_((torch.randn(p.shape, generator=g) * (scale * p.float().std().item())).to(p.device, p.dtype))


def greedy_params():
    from rlcore.interfaces import SamplingParams

    return SamplingParams(n=1, temperature=0.0, max_new_tokens=NEW)


def tokens(results):
    return [r[0].token_ids for r in results]


def conformance(label, engine, model, prompts):
    """rlcore's rollout-engine conformance kit, when it is importable."""
    try:
        from rlcore.testing.engines import check_rollout_engine
    except ImportError as exc:
        RESULTS["errors"]["conformance"] = f"kit not importable: {exc}"
        return
    try:
        res = check_rollout_engine(engine, vocab_size=2048, prompts=[list(p) for p in prompts[:4]], reference_model=model,
                                   logprob_atol=0.5, greedy_margin=0.5, max_new_tokens=8)
        check(f"{label}_conformance_kit", True, results=res)
    except Exception as exc:  # noqa: BLE001
        check(f"{label}_conformance_kit", False, error=f"{type(exc).__name__}: {exc}"[:600])


def colocated(model_dir, model, prompts):
    from rlcore.interfaces import BuildContext, SamplingParams
    from rlcore_rollout_vllm.engine import build
    from rlcore_rollout_vllm.options import VLLMOptions
    from rlcore_rollout_vllm.weights import LoraSpec

    opts = VLLMOptions(model=model_dir, gpu_memory_utilization=0.25, max_model_len=512, dtype="bfloat16", lora_rank=8, seed=0)
    t = time.time()
    engine = build(opts, BuildContext(seed=0, dtype="bfloat16"))
    RESULTS["colocated_start_s"] = round(time.time() - t, 1)
    RESULTS["vllm_version"] = engine.version
    base = tokens(engine.generate(prompts, greedy_params()))
    ref = hf_greedy(model, prompts)
    seq, pos = match(base, ref)
    check("colocated_greedy_matches_transformers", pos >= 0.85, seq_match=seq, token_match=pos)

    sampled = engine.generate(prompts[:4], SamplingParams(n=4, temperature=1.0, max_new_tokens=NEW, seed=3))
    ok_shape = all(len(g) == 4 and all(len(c.token_ids) == NEW == len(c.logprobs) for c in g) for g in sampled)
    diffs = []
    for p, group in zip(prompts[:4], sampled):
        for c in group:
            diffs += [abs(a - b) for a, b in zip(c.logprobs, hf_logprobs(model, p, c.token_ids))]
    mean_diff = sum(diffs) / len(diffs)
    check("colocated_sampling_logprobs_match_transformers", ok_shape and mean_diff < 0.15, mean_abs_diff=mean_diff,
          median_abs_diff=sorted(diffs)[len(diffs) // 2], max_abs_diff=max(diffs), shapes_ok=ok_shape)
    conformance("colocated", engine, model, prompts)

    free0 = torch.cuda.mem_get_info()[0]
    engine.sleep()
    free1 = torch.cuda.mem_get_info()[0]
    engine.wake_up()
    again = tokens(engine.generate(prompts, greedy_params()))
    check("colocated_sleep_frees_memory", free1 - free0 > 1 << 30, freed_gib=round((free1 - free0) / 2**30, 2))
    check("colocated_wake_up_same_greedy", again == base)

    # Trainer flow: sleep, train (perturb), wake, push full weights in buckets.
    engine.sleep()
    perturb(model, 0.5, seed=1)
    engine.wake_up()
    t = time.time()
    engine.update_weights(((n, p.detach()) for n, p in model.state_dict().items()))
    RESULTS["full_update_s"] = round(time.time() - t, 3)
    after = tokens(engine.generate(prompts, greedy_params()))
    ref = hf_greedy(model, prompts)
    seq, pos = match(after, ref)
    changed = match(after, base)[1]
    check("colocated_full_update_greedy_matches_trainer", pos >= 0.85 and changed < 0.5, seq_match=seq, token_match=pos, token_match_with_old=changed)

    # Update while asleep (weights woken alone), small buckets.
    engine.options.weight_bucket_mb = 1
    engine.sleep()
    perturb(model, 0.5, seed=2)
    engine.update_weights(model.state_dict().items())
    engine.wake_up()
    after2 = tokens(engine.generate(prompts, greedy_params()))
    seq, pos = match(after2, hf_greedy(model, prompts))
    check("colocated_update_while_asleep_1mb_buckets", pos >= 0.85, seq_match=seq, token_match=pos)

    # LoRA: only adapter tensors travel.
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets, lora_dropout=0.0))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    peft_model.eval()
    spec = LoraSpec(rank=8, alpha=16, target_modules=targets)
    engine.update_weights(get_peft_model_state_dict(peft_model).items(), lora=spec)
    lora_out = tokens(engine.generate(prompts, greedy_params()))
    ref = hf_greedy(peft_model, prompts)
    seq, pos = match(lora_out, ref)
    check("colocated_lora_greedy_matches_peft", pos >= 0.85 and match(lora_out, after2)[1] < 0.5, seq_match=seq, token_match=pos)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    engine.update_weights(get_peft_model_state_dict(peft_model).items(), lora=spec)
    seq, pos = match(tokens(engine.generate(prompts, greedy_params())), hf_greedy(peft_model, prompts))
    check("colocated_second_lora_update", pos >= 0.85, seq_match=seq, token_match=pos)
    try:
        engine.update_weights([("model.layers.0.nonexistent.weight", torch.zeros(3, device="cuda"))])
        check("colocated_rejected_update_is_clear", False, error="no error raised")
    except Exception as exc:  # noqa: BLE001
        check("colocated_rejected_update_is_clear", "rejected a weight update" in str(exc), message=str(exc)[:300])
    model = peft_model.unload()
    return engine


def server(server_dir, model, prompts, url, proc, sync_dir):
    from rlcore_rollout_vllm.engine import build
    from rlcore_rollout_vllm.options import VLLMOptions
    from rlcore_rollout_vllm.weights import LoraSpec
    import httpx

    t = time.time()
    while time.time() - t < 300:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(2)
    RESULTS["server_wait_s"] = round(time.time() - t, 1)
    try:
        build(VLLMOptions(mode="server", servers=["http://127.0.0.1:9"], connect_timeout_s=2), None)
        check("server_unreachable_is_clear", False)
    except Exception as exc:  # noqa: BLE001
        check("server_unreachable_is_clear", "http://127.0.0.1:9" in str(exc), message=str(exc)[:300])
    engine = build(VLLMOptions(mode="server", servers=[url], weight_sync_dir=sync_dir, server_sleep=True, sleep_level=1, lora_rank=8), None)
    base = tokens(engine.generate(prompts, greedy_params()))
    seq, pos = match(base, hf_greedy(model, prompts))
    check("server_greedy_matches_transformers", pos >= 0.85, seq_match=seq, token_match=pos)
    from rlcore.interfaces import SamplingParams

    sampled = engine.generate(prompts[:4], SamplingParams(n=3, temperature=1.0, max_new_tokens=NEW, seed=5))
    diffs = [abs(a - b) for p, g in zip(prompts[:4], sampled) for c in g for a, b in zip(c.logprobs, hf_logprobs(model, p, c.token_ids))]
    check("server_sampling_logprobs_match_transformers", sum(diffs) / len(diffs) < 0.15, mean_abs_diff=sum(diffs) / len(diffs),
          median_abs_diff=sorted(diffs)[len(diffs) // 2], max_abs_diff=max(diffs))
    # A dead server in the pool: its requests are retried on the live one, nothing lost.
    engine.pool.urls.insert(0, "http://127.0.0.1:9")
    engine.pool._busy["http://127.0.0.1:9"] = 0
    retried = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=NEW, seed=7))
    check("server_retry_loses_no_samples", all(len(g) == 2 for g in retried) and len(retried) == len(prompts), down=list(engine.pool.down))
    engine.pool.urls.remove("http://127.0.0.1:9")
    conformance("server", engine, model, prompts)
    engine.sleep()
    engine.wake_up()
    again = tokens(engine.generate(prompts, greedy_params()))
    check("server_sleep_wake_same_greedy", again == base)
    perturb(model, 0.5, seed=11)
    engine.update_weights(model.state_dict().items())
    after = tokens(engine.generate(prompts, greedy_params()))
    seq, pos = match(after, hf_greedy(model, prompts))
    check("server_full_update_greedy_matches_trainer", pos >= 0.85 and match(after, base)[1] < 0.5, seq_match=seq, token_match=pos)
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    targets = ["q_proj", "v_proj", "o_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    engine.update_weights(get_peft_model_state_dict(peft_model).items(), lora=LoraSpec(rank=8, alpha=16, target_modules=targets))
    seq, pos = match(tokens(engine.generate(prompts, greedy_params())), hf_greedy(peft_model, prompts))
    check("server_lora_greedy_matches_peft", pos >= 0.85, seq_match=seq, token_match=pos)
    try:
        engine.update_weights([("model.embed_tokens.weight", torch.zeros(7, 3))])
        check("server_rejected_update_is_clear", False, error="no error raised")
    except Exception as exc:  # noqa: BLE001
        check("server_rejected_update_is_clear", url.split("//")[1] in str(exc) or url in str(exc), message=str(exc)[:400])


def main(out_dir: str) -> int:
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="rlcore-vllm-gpu-")
    model_dir, server_dir, sync_dir = (os.path.join(work, d) for d in ("model", "served", "sync"))
    model = make_model_dir(model_dir)
    shutil.copytree(model_dir, server_dir)
    model = model.cuda().eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 2048, (PROMPT_LEN,), generator=g).tolist() for _ in range(8)]
    port = 8011
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_ALLOW_RUNTIME_LORA_UPDATING="1")
    server_log = open(os.path.join(out_dir, "vllm_serve.log"), "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", server_dir, "--port", str(port),
         "--gpu-memory-utilization", "0.2", "--max-model-len", "512", "--dtype", "bfloat16", "--enable-lora",
         "--max-lora-rank", "8", "--enable-sleep-mode", "--logprobs-mode", "processed_logprobs", "--seed", "0"],
        stdout=server_log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    try:
        for name, fn in (("colocated", lambda: colocated(model_dir, model, prompts)),
                         ("server", lambda: server(server_dir, make_model_dir(os.path.join(work, "m2")).cuda().eval(), prompts, f"http://127.0.0.1:{port}", proc, sync_dir))):
            try:
                fn()
            except Exception as exc:  # noqa: BLE001
                RESULTS["errors"][name] = traceback.format_exc()[-3000:]
                log("ERROR in", name, exc)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        with open(os.path.join(out_dir, "results.json"), "w") as f:
            json.dump(RESULTS, f, indent=2)
    failed = [k for k, v in RESULTS["checks"].items() if not v["ok"]]
    log("failed checks:", failed, "errors:", list(RESULTS["errors"]))
    return 1 if failed or RESULTS["errors"].keys() - {"conformance"} else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "gpu-out")))
