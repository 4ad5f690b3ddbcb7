"""End-to-end check of the vllm engine on a GPU, against the trainer's own models (transformers).

The models come from ``make_check_models.py`` (built on CPU when missing): ``A`` and ``B`` are
tiny Qwen2s *trained* on synthetic tasks, so that greedy decoding has wide margins and a bf16
kernel difference cannot flip a token; ``lora1``/``lora2`` are PEFT adapters on ``A``.

Two parts run at the same time, so that a time limit cannot cut either one:

- **server** (this process): ``vllm serve`` on A; greedy and log-probs; a dead server in the
  pool; sleep/wake; full-weight reload to B and back to A through ``weight_sync_dir`` and
  ``/collective_rpc reload_weights``; LoRA adapters through ``/v1/load_lora_adapter``.
- **colocated** (a child process, ``--part colocated``): ``vllm.LLM`` on A; greedy, teacher-forced
  and sampled log-probs; sleep/wake; full updates to B (1 MB buckets, awake) and back to A (while
  asleep), each followed by reading vLLM's parameters back through ``LLM.apply_model`` and
  comparing them with the sent tensors (fused ``qkv_proj``/``gate_up_proj`` taken apart); two
  LoRA updates compared with peft.

Every check is written to ``OUT/results.json`` as soon as it runs (the colocated part's to
``OUT/results_colocated.json``, merged at the end). Greedy criterion: at least 85% of the tokens
equal transformers' greedy tokens of the target model (bf16, same weights).

    python plugins/rollout_vllm/scripts/gpu_check.py OUT_DIR [--models DIR] [--deadline-s 420]
    python plugins/rollout_vllm/scripts/gpu_check.py OUT_DIR --dry-run   # CPU, no vLLM: helpers and models

Used by ``tests/test_rollout_vllm_gpu.py`` (``pytest -m vllm``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_check_models as mcm  # noqa: E402  (light: imports torch only inside functions)

GREEDY_MIN = 0.85  # fraction of greedy tokens that must equal the reference's
DIFFER_MAX = 0.5  # after an update, at most this fraction may equal the old model's tokens
LOGPROB_MEAN_MAX = 0.15  # mean |vLLM - transformers| log-prob on the same tokens
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class Results:
    """Checks and facts, written to ``path`` after every change so a cut run leaves them."""

    def __init__(self, path: Path, label: str):
        self.path, self.label = path, label
        self.data: dict = {"checks": {}, "errors": {}, "info": {}}

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)

    def check(self, name: str, ok: bool, **info) -> bool:
        self.data["checks"][name] = {"ok": bool(ok), **info}
        log(self.label, "CHECK", name, "OK" if ok else "FAIL", json.dumps(info, default=str)[:500])
        self.save()
        return bool(ok)

    def info(self, **kv) -> None:
        self.data["info"].update(kv)
        self.save()

    def error(self, name: str, exc: BaseException) -> None:
        self.data["errors"][name] = traceback.format_exc()[-3000:]
        log(self.label, "ERROR in", name, f"{type(exc).__name__}: {exc}"[:500])
        self.save()


def log(*a) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def guarded(fn):
    """A comparison that raises is recorded as a failed check, and the run goes on."""

    def wrapper(res: Results, name: str, *args, **kwargs) -> bool:
        try:
            return fn(res, name, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            return res.check(
                name,
                False,
                error=f"{type(exc).__name__}: {exc}"[:800],
                traceback=traceback.format_exc()[-1500:],
            )

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


# ---------------------------------------------------------------------- comparisons (pure)


def token_match(got: list[list[int]], ref: list[list[int]]) -> dict:
    """Fraction of sequences identical, of positions identical, and of positions before the
    first difference (a greedy mismatch changes everything after it)."""
    if len(got) != len(ref):
        raise ValueError(f"{len(got)} outputs against {len(ref)} references")
    total = sum(len(r) for r in ref)
    same = sum(sum(a == b for a, b in zip(g, r)) for g, r in zip(got, ref))
    prefix = 0
    for g, r in zip(got, ref):
        for a, b in zip(g, r):
            if a != b:
                break
            prefix += 1
    return {
        "seq_match": sum(g == r for g, r in zip(got, ref)) / len(ref),
        "token_match": same / total,
        "prefix_match": prefix / total,
    }


def diff_stats(a: list[float], b: list[float]) -> dict:
    d = sorted(abs(x - y) for x, y in zip(a, b))
    if not d:
        return {
            "n": 0,
            "mean_abs_diff": float("nan"),
            "median_abs_diff": float("nan"),
            "max_abs_diff": float("nan"),
        }
    return {
        "n": len(d),
        "mean_abs_diff": sum(d) / len(d),
        "median_abs_diff": d[len(d) // 2],
        "max_abs_diff": d[-1],
    }


def expected_param(vllm_name: str, hf: dict):
    """The Hugging Face tensor(s) a vLLM parameter should hold: vLLM fuses q/k/v into
    ``qkv_proj`` and gate/up into ``gate_up_proj`` (concatenated along dim 0), and with LoRA
    enabled keeps base weights under ``base_layer``. None when nothing maps onto it."""
    import torch

    name = vllm_name.replace(".base_layer.", ".")
    if name in hf:
        return hf[name]
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in FUSED:
        pieces = [".".join([*parts[:-2], sub, parts[-1]]) for sub in FUSED[parts[-2]]]
        if all(p in hf for p in pieces):
            return torch.cat([hf[p] for p in pieces], 0)
    return None


def hf_names_of(vllm_name: str) -> list[str]:
    name = vllm_name.replace(".base_layer.", ".")
    parts = name.split(".")
    if len(parts) >= 2 and parts[-2] in FUSED:
        return [".".join([*parts[:-2], sub, parts[-1]]) for sub in FUSED[parts[-2]]]
    return [name]


def compare_params(vllm_params: dict, target: dict, previous: dict | None = None, tol: float = 0.0) -> dict:
    """vLLM's parameters against the tensors that were sent (``target``, HF names) and, when
    given, the ones they replaced (``previous``). Reports each tensor's max |diff|, the ones
    still holding the previous values (not updated), vLLM parameters with no HF counterpart,
    and HF tensors that no vLLM parameter holds. Vocabulary padding rows are ignored."""
    per_tensor, not_updated, wrong, unmatched = {}, [], [], []
    used: set[str] = set()
    for name, got in sorted(vllm_params.items()):
        if "lora_" in name:
            continue
        want = expected_param(name, target)
        if want is None:
            unmatched.append(name)
            continue
        used.update(hf_names_of(name))
        got = got.float()
        rows = min(got.shape[0], want.shape[0]) if got.dim() else None
        if got.dim() and got.shape[1:] != want.shape[1:] or (got.dim() and got.shape[0] < want.shape[0]):
            wrong.append(f"{name}: vLLM {tuple(got.shape)} vs sent {tuple(want.shape)}")
            continue
        g = got[:rows] if rows is not None else got
        d = float((g - want.float().to(g.device)).abs().max()) if g.numel() else 0.0
        per_tensor[name] = d
        if d > tol:
            wrong.append(f"{name}: max |diff| {d:.3g}")
            if previous is not None:
                old = expected_param(name, previous)
                if old is not None and float((g - old.float().to(g.device)).abs().max()) <= tol:
                    not_updated.append(name)
    unused = sorted(set(target) - used)
    return {
        "tensors": len(per_tensor),
        "max_abs_diff": max(per_tensor.values(), default=float("nan")),
        "per_tensor_max_abs_diff": per_tensor,
        "mismatched": wrong,
        "not_updated": not_updated,
        "vllm_params_without_hf_tensor": unmatched,
        "hf_tensors_not_in_vllm": unused,
        "ok": bool(per_tensor) and not wrong and not unmatched and not unused,
    }


def fuse_like_vllm(hf: dict, lora_wrapped: bool = False) -> dict:
    """HF tensors in vLLM's layout (fused q/k/v and gate/up; ``base_layer`` when LoRA wraps the
    linear layers): what :func:`compare_params` sees in the dry run."""
    import torch

    out = {}
    for name, t in hf.items():
        parts = name.split(".")
        fused = next((f for f, subs in FUSED.items() if len(parts) >= 2 and parts[-2] in subs), None)
        if fused is None:
            out[name] = t
            continue
        if parts[-2] != FUSED[fused][0]:
            continue
        stem = ".".join(parts[:-2])
        out[f"{stem}.{fused}.{parts[-1]}"] = torch.cat(
            [hf[f"{stem}.{s}.{parts[-1]}"] for s in FUSED[fused]], 0
        )
    if lora_wrapped:
        out = {
            (n.rsplit(".", 1)[0] + ".base_layer." + n.rsplit(".", 1)[1]) if "_proj." in n else n: t
            for n, t in out.items()
        }
    return out


# ---------------------------------------------------------------------- references (transformers)


class Refs:
    """The trainer's models: A, B, A+lora1, A+lora2, each in bf16 (greedy reference) and fp32
    (log-prob reference, same bf16-rounded weights), on ``device``."""

    def __init__(self, models: Path, device: str):
        import torch
        from peft import PeftModel
        from safetensors.torch import load_file
        from transformers import Qwen2ForCausalLM

        self.models, self.device = models, device
        manifest = json.loads((models / "manifest.json").read_text())
        self.prompts: list[list[int]] = manifest["prompts"]
        self.new_tokens: int = manifest["new_tokens"]
        self.manifest = manifest
        self.lora = manifest["lora"]
        self.state = {m: load_file(str(models / m / "model.safetensors")) for m in ("A", "B")}
        self.adapters = {
            m: load_file(str(models / m / "adapter_model.safetensors")) for m in ("lora1", "lora2")
        }
        self.model: dict = {}
        for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
            for m in ("A", "B"):
                self.model[m, tag] = (
                    Qwen2ForCausalLM.from_pretrained(str(models / m), dtype=dtype).to(device).eval()
                )
            for m in ("lora1", "lora2"):
                base = Qwen2ForCausalLM.from_pretrained(str(models / "A"), dtype=dtype).to(device)
                self.model[m, tag] = PeftModel.from_pretrained(base, str(models / m)).to(device).eval()
        self._greedy: dict = {}

    def greedy(self, m: str, tag: str = "bf16") -> list[list[int]]:
        import torch

        if (m, tag) not in self._greedy:
            model, out = self.model[m, tag], []
            with torch.no_grad():
                for p in self.prompts:
                    ids = torch.tensor([p], device=self.device)
                    g = model.generate(
                        input_ids=ids,
                        attention_mask=torch.ones_like(ids),
                        do_sample=False,
                        max_new_tokens=self.new_tokens,
                        min_new_tokens=self.new_tokens,
                        eos_token_id=None,
                        pad_token_id=0,
                    )
                    out.append(g[0, len(p) :].tolist())
            self._greedy[m, tag] = out
        return self._greedy[m, tag]

    def logprobs(self, m: str, prompt, response, tag: str = "fp32") -> tuple[list[float], list[bool]]:
        """Teacher-forced log-probs of ``response`` after ``prompt``, and whether each token is
        the model's argmax there."""
        import torch

        with torch.no_grad():
            ids = torch.tensor([list(prompt) + list(response)], device=self.device)
            logits = self.model[m, tag](input_ids=ids).logits.float()[0, len(prompt) - 1 : -1]
            resp = torch.tensor(list(response), device=self.device)
            lp = torch.log_softmax(logits, -1).gather(-1, resp[:, None])[:, 0]
            return lp.tolist(), (logits.argmax(-1) == resp).tolist()

    def full_weights(self, m: str, device: str | None = None) -> list:
        return [(n, t.to(device or self.device)) for n, t in self.state[m].items()]

    def adapter(self, m: str) -> list:
        return list(self.adapters[m].items())

    def lora_spec(self):
        from rlcore_rollout_vllm.weights import LoraSpec

        return LoraSpec(
            rank=self.lora["rank"], alpha=self.lora["alpha"], target_modules=self.lora["target_modules"]
        )


def greedy_params(new: int):
    from rlcore.interfaces import SamplingParams

    return SamplingParams(n=1, temperature=0.0, max_new_tokens=new)


def tokens(results) -> list[list[int]]:
    return [r[0].token_ids for r in results]


@guarded
def compare_greedy(
    res: Results, name: str, got, refs: Refs, target: str, old: str | None = None, old_tokens=None
) -> bool:
    """``got`` against transformers' greedy output of ``target`` (bf16; fp32 reported), and, with
    ``old``/``old_tokens``, different from what the previous weights produced."""
    m = token_match(got, refs.greedy(target))
    info = {**m, "vs_fp32_reference": token_match(got, refs.greedy(target, "fp32"))["token_match"]}
    # teacher-forced: is each of vLLM's tokens transformers' argmax given vLLM's own prefix?
    agree = [a for p, g in zip(refs.prompts, got) for a in refs.logprobs(target, p, g, "bf16")[1]]
    info["transformers_argmax_on_vllm_path"] = sum(agree) / len(agree)
    ok = m["token_match"] >= GREEDY_MIN
    if old is not None or old_tokens is not None:
        before = old_tokens if old_tokens is not None else refs.greedy(old)
        info["token_match_with_old"] = token_match(got, before)["token_match"]
        ok = ok and info["token_match_with_old"] < DIFFER_MAX
    return res.check(name, ok, **info)


@guarded
def compare_sampled_logprobs(res: Results, name: str, groups, refs: Refs, target: str, prompts) -> bool:
    """vLLM's log-probs of its sampled tokens (temperature 1) against transformers' (fp32) on the
    same tokens."""
    got, want = [], []
    for p, group in zip(prompts, groups):
        for c in group:
            got += list(c.logprobs)
            want += refs.logprobs(target, p, c.token_ids)[0]
    s = diff_stats(got, want)
    return res.check(name, s["n"] > 0 and s["mean_abs_diff"] < LOGPROB_MEAN_MAX, **s)


def conformance(res: Results, label: str, engine, model, prompts) -> None:
    """rlcore's rollout-engine conformance kit, when it is importable."""
    try:
        from rlcore.testing.engines import check_rollout_engine
    except ImportError as exc:
        res.data["errors"]["conformance"] = f"kit not importable: {exc}"
        return
    try:
        out = check_rollout_engine(
            engine,
            vocab_size=mcm.VOCAB,
            prompts=[list(p) for p in prompts[:4]],
            reference_model=model,
            logprob_atol=0.5,
            greedy_margin=0.5,
            max_new_tokens=8,
            expect_diverse=False,
        )
        res.check(f"{label}_conformance_kit", True, results=out)
    except Exception as exc:  # noqa: BLE001
        res.check(f"{label}_conformance_kit", False, error=f"{type(exc).__name__}: {exc}"[:600])


# ---------------------------------------------------------------------- colocated part


def read_back(engine) -> dict:
    """vLLM's parameters, copied to CPU, through the public ``LLM.apply_model`` (in-process)."""
    found = engine.llm.apply_model(
        lambda model: {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}
    )
    return found[0]


def vllm_teacher_forced(engine, prompts, responses, lora_request=None) -> tuple[list[float], list[bool]]:
    """vLLM's prompt log-probs of ``prompt + response`` at the response's tokens, and whether each
    is vLLM's argmax there (rank 1): a check of the logits that no greedy cascade can amplify."""
    from vllm import SamplingParams

    inputs = [{"prompt_token_ids": list(p) + list(r)} for p, r in zip(prompts, responses)]
    outs = engine.llm.generate(
        inputs,
        SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0),
        use_tqdm=False,
        lora_request=lora_request,
    )
    lps, top = [], []
    for out, p, r in zip(outs, prompts, responses):
        for pos, tok in enumerate(r):
            entry = out.prompt_logprobs[len(p) + pos][tok]
            lps.append(float(entry.logprob))
            top.append(entry.rank == 1)
    return lps, top


@guarded
def compare_teacher_forced(
    res: Results, name: str, engine, refs: Refs, target: str, lora_request=None
) -> bool:
    responses = refs.greedy(target)
    got, top = vllm_teacher_forced(engine, refs.prompts, responses, lora_request)
    want = [x for p, r in zip(refs.prompts, responses) for x in refs.logprobs(target, p, r)[0]]
    s = diff_stats(got, want)
    s["vllm_argmax_on_reference_path"] = sum(top) / len(top)
    return res.check(
        name, s["mean_abs_diff"] < LOGPROB_MEAN_MAX and s["vllm_argmax_on_reference_path"] >= GREEDY_MIN, **s
    )


@guarded
def compare_read_back(res: Results, name: str, engine, target: dict, previous: dict | None) -> bool:
    t = time.time()
    cmp = compare_params(read_back(engine), target, previous)
    cmp["read_back_s"] = round(time.time() - t, 2)
    ok = cmp.pop("ok")
    return res.check(name, ok, **cmp)


def colocated(res: Results, refs: Refs) -> None:
    import torch
    from rlcore_rollout_vllm.engine import build
    from rlcore_rollout_vllm.options import VLLMOptions

    from rlcore.interfaces import BuildContext, SamplingParams

    new, prompts = refs.new_tokens, refs.prompts
    opts = VLLMOptions(
        model=str(refs.models / "A"),
        gpu_memory_utilization=0.25,
        max_model_len=512,
        dtype="bfloat16",
        lora_rank=refs.lora["rank"],
        seed=0,
    )
    t = time.time()
    engine = build(opts, BuildContext(seed=0, dtype="bfloat16"))
    res.info(colocated_start_s=round(time.time() - t, 1), vllm_version=engine.version)

    base = tokens(engine.generate(prompts, greedy_params(new)))
    compare_greedy(res, "colocated_A_greedy_matches_transformers", base, refs, "A")
    compare_teacher_forced(res, "colocated_A_teacher_forced_logprobs", engine, refs, "A")
    sampled = engine.generate(prompts[:4], SamplingParams(n=4, temperature=1.0, max_new_tokens=new, seed=3))
    shapes = all(len(g) == 4 and all(len(c.token_ids) == new == len(c.logprobs) for c in g) for g in sampled)
    res.check("colocated_sampling_shapes", shapes)
    compare_sampled_logprobs(res, "colocated_A_sampled_logprobs", sampled, refs, "A", prompts[:4])
    compare_read_back(res, "colocated_A_read_back_before_update", engine, refs.state["A"], None)

    free0 = torch.cuda.mem_get_info()[0]
    engine.sleep()
    free1 = torch.cuda.mem_get_info()[0]
    engine.wake_up()
    res.check(
        "colocated_sleep_frees_memory", free1 - free0 > 1 << 30, freed_gib=round((free1 - free0) / 2**30, 2)
    )
    res.check("colocated_wake_up_same_greedy", tokens(engine.generate(prompts, greedy_params(new))) == base)

    # Full update A -> B, awake, in 1 MB buckets (many buckets).
    engine.options.weight_bucket_mb = 1
    t = time.time()
    engine.update_weights(refs.full_weights("B", "cuda"))
    res.info(full_update_1mb_buckets_s=round(time.time() - t, 3))
    compare_read_back(res, "colocated_B_read_back_after_update", engine, refs.state["B"], refs.state["A"])
    out_b = tokens(engine.generate(prompts, greedy_params(new)))
    compare_greedy(res, "colocated_B_full_update_greedy_matches_trainer", out_b, refs, "B", old_tokens=base)
    compare_teacher_forced(res, "colocated_B_teacher_forced_logprobs", engine, refs, "B")
    sampled = engine.generate(prompts[:4], SamplingParams(n=4, temperature=1.0, max_new_tokens=new, seed=4))
    compare_sampled_logprobs(res, "colocated_B_sampled_logprobs", sampled, refs, "B", prompts[:4])

    # Full update B -> A while asleep (weights woken alone), default buckets.
    engine.options.weight_bucket_mb = 512
    engine.sleep()
    engine.update_weights(refs.full_weights("A", "cuda"))
    engine.wake_up()
    compare_read_back(
        res, "colocated_A_read_back_after_update_while_asleep", engine, refs.state["A"], refs.state["B"]
    )
    out_a = tokens(engine.generate(prompts, greedy_params(new)))
    compare_greedy(
        res, "colocated_A_update_while_asleep_greedy_matches_trainer", out_a, refs, "A", old_tokens=out_b
    )
    conformance(res, "colocated", engine, refs.model["A", "bf16"], prompts)

    # LoRA adapters on A: only adapter tensors travel.
    prev = out_a
    for name in ("lora1", "lora2"):
        engine.update_weights(refs.adapter(name), lora=refs.lora_spec())
        got = tokens(engine.generate(prompts, greedy_params(new)))
        compare_greedy(res, f"colocated_{name}_greedy_matches_peft", got, refs, name, old_tokens=prev)
        compare_teacher_forced(
            res, f"colocated_{name}_teacher_forced_logprobs", engine, refs, name, engine._lora_request
        )
        prev = got
    kept = sorted(os.listdir(engine._adapters.root))  # lora1's files went when lora2 replaced it
    res.check("colocated_replaced_adapter_files_removed", kept == ["v2"], kept=kept)
    compare_read_back(res, "colocated_base_unchanged_with_lora", engine, refs.state["A"], None)
    try:
        engine.update_weights([("model.layers.0.nonexistent.weight", torch.zeros(3, device="cuda"))])
        res.check("colocated_rejected_update_is_clear", False, error="no error raised")
    except Exception as exc:  # noqa: BLE001
        res.check(
            "colocated_rejected_update_is_clear",
            "rejected a weight update" in str(exc),
            message=str(exc)[:300],
        )


def colocated_main(out: Path, models: Path) -> int:
    res = Results(out / "results_colocated.json", "[colocated]")
    try:
        refs = Refs(models, "cuda")
        colocated(res, refs)
    except Exception as exc:  # noqa: BLE001
        res.error("colocated", exc)
    res.save()
    return 0


# ---------------------------------------------------------------------- server part


def start_server(models: Path, port: int, log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", VLLM_ALLOW_RUNTIME_LORA_UPDATING="1")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.cli.main",
            "serve",
            str(models / "A"),
            "--port",
            str(port),
            "--gpu-memory-utilization",
            "0.55",
            "--max-model-len",
            "512",
            "--dtype",
            "bfloat16",
            "--enable-lora",
            "--max-lora-rank",
            str(mcm.LORA_RANK),
            "--enable-sleep-mode",
            "--logprobs-mode",
            "processed_logprobs",
            "--seed",
            "0",
        ],
        stdout=open(log_path, "w"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def server_log_warnings(log_path: Path, since: int) -> tuple[list[str], int]:
    """vLLM's "weights were not loaded" warnings written after byte ``since``."""
    text = log_path.read_text(errors="replace")
    return [line[:400] for line in text[since:].splitlines() if "were not loaded" in line], len(text)


def server(res: Results, refs: Refs, url: str, proc: subprocess.Popen, sync_dir: str, log_path: Path) -> None:
    import httpx
    import torch
    from rlcore_rollout_vllm.engine import build
    from rlcore_rollout_vllm.options import VLLMOptions

    from rlcore.interfaces import SamplingParams

    new, prompts = refs.new_tokens, refs.prompts
    t = time.time()
    while time.time() - t < 240:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}; see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)
    res.info(server_wait_s=round(time.time() - t, 1))
    try:
        build(VLLMOptions(mode="server", servers=["http://127.0.0.1:9"], connect_timeout_s=2), None)
        res.check("server_unreachable_is_clear", False)
    except Exception as exc:  # noqa: BLE001
        res.check("server_unreachable_is_clear", "http://127.0.0.1:9" in str(exc), message=str(exc)[:300])
    engine = build(
        VLLMOptions(
            mode="server",
            servers=[url],
            weight_sync_dir=sync_dir,
            server_sleep=True,
            sleep_level=1,
            lora_rank=refs.lora["rank"],
            request_timeout_s=60,
        ),
        None,
    )
    base = tokens(engine.generate(prompts, greedy_params(new)))
    compare_greedy(res, "server_A_greedy_matches_transformers", base, refs, "A")
    sampled = engine.generate(prompts[:4], SamplingParams(n=3, temperature=1.0, max_new_tokens=new, seed=5))
    compare_sampled_logprobs(res, "server_A_sampled_logprobs", sampled, refs, "A", prompts[:4])

    # Full-weight reload A -> B through weight_sync_dir and /collective_rpc reload_weights.
    _, mark = server_log_warnings(log_path, 0)
    t = time.time()
    engine.update_weights(refs.full_weights("B", "cpu"))
    res.info(server_full_reload_s=round(time.time() - t, 2))
    warnings, mark = server_log_warnings(log_path, mark)
    res.check("server_B_reload_loads_every_weight", not warnings, warnings=warnings)
    out_b = tokens(engine.generate(prompts, greedy_params(new)))
    compare_greedy(res, "server_B_full_reload_greedy_matches_trainer", out_b, refs, "B", old_tokens=base)
    sampled = engine.generate(prompts[:4], SamplingParams(n=3, temperature=1.0, max_new_tokens=new, seed=6))
    compare_sampled_logprobs(res, "server_B_sampled_logprobs", sampled, refs, "B", prompts[:4])

    # ... and back to A (a second reload; the LoRA adapters were trained on A).
    engine.update_weights(refs.full_weights("A", "cpu"))
    warnings, mark = server_log_warnings(log_path, mark)
    out_a = tokens(engine.generate(prompts, greedy_params(new)))
    ok = compare_greedy(
        res, "server_A_second_reload_greedy_matches_trainer", out_a, refs, "A", old_tokens=out_b
    )
    res.check("server_A_reload_loads_every_weight", not warnings, warnings=warnings)

    # A dead server in the pool: its requests are retried on the live one, nothing lost.
    engine.pool.urls.insert(0, "http://127.0.0.1:9")
    engine.pool._busy["http://127.0.0.1:9"] = 0
    retried = engine.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=new, seed=7))
    res.check(
        "server_retry_loses_no_samples",
        all(len(g) == 2 for g in retried) and len(retried) == len(prompts),
        down=list(engine.pool.down),
    )
    engine.pool.urls.remove("http://127.0.0.1:9")
    engine.sleep()
    engine.wake_up()
    res.check("server_sleep_wake_same_greedy", tokens(engine.generate(prompts, greedy_params(new))) == out_a)

    # LoRA adapters through /v1/load_lora_adapter.
    prev = out_a
    for name in ("lora1", "lora2"):
        engine.update_weights(refs.adapter(name), lora=refs.lora_spec())
        got = tokens(engine.generate(prompts, greedy_params(new)))
        compare_greedy(res, f"server_{name}_greedy_matches_peft", got, refs, name, old_tokens=prev)
        prev = got
    sampled = engine.generate(prompts[:4], SamplingParams(n=3, temperature=1.0, max_new_tokens=new, seed=8))
    compare_sampled_logprobs(res, "server_lora2_sampled_logprobs", sampled, refs, "lora2", prompts[:4])
    if ok:
        engine.model = engine.base_model  # the kit pushes A's weights and compares with A
        conformance(res, "server", engine, refs.model["A", "bf16"], prompts)
    try:
        engine.update_weights([("model.embed_tokens.weight", torch.zeros(7, 3))])
        res.check("server_rejected_update_is_clear", False, error="no error raised")
    except Exception as exc:  # noqa: BLE001
        res.check(
            "server_rejected_update_is_clear",
            url.split("//")[1] in str(exc) or url in str(exc),
            message=str(exc)[:400],
        )


# ---------------------------------------------------------------------- dry run (CPU, no vLLM)


def dry_run(res: Results, refs: Refs, work: Path) -> None:
    """What can be checked without vLLM: the models' greedy outputs against what was measured
    when they were built, the read-back comparison on HF tensors laid out like vLLM's, and the
    plugin's own weight files (shards, PEFT adapters) loaded back into transformers."""
    import torch
    from peft import PeftModel
    from transformers import Qwen2ForCausalLM

    from rlcore.engine_kit.weights import write_adapter, write_shards

    for m in ("A", "B", "lora1", "lora2"):
        got = refs.greedy(m)
        res.check(
            f"dry_{m}_greedy_as_built",
            got == refs.manifest["cpu_greedy_bf16"][m],
            **token_match(got, refs.manifest["cpu_greedy_bf16"][m]),
        )
        res.check(
            f"dry_{m}_greedy_fp32_vs_bf16",
            token_match(refs.greedy(m, "fp32"), got)["token_match"] >= GREEDY_MIN,
            **token_match(refs.greedy(m, "fp32"), got),
        )
    compare_greedy(res, "dry_B_differs_from_A", refs.greedy("B"), refs, "B", old="A")
    compare_greedy(res, "dry_lora1_differs_from_A", refs.greedy("lora1"), refs, "lora1", old="A")
    compare_greedy(res, "dry_lora2_differs_from_lora1", refs.greedy("lora2"), refs, "lora2", old="lora1")

    a, b = refs.state["A"], refs.state["B"]
    for wrapped in (False, True):
        tag = "lora_layout" if wrapped else "plain_layout"
        cmp = compare_params(fuse_like_vllm(b, wrapped), b, a)
        res.check(
            f"dry_read_back_exact_{tag}", cmp["ok"] and cmp["max_abs_diff"] == 0.0, tensors=cmp["tensors"]
        )
        stale = fuse_like_vllm(b, wrapped)
        key = next(n for n in stale if "qkv_proj" in n and n.endswith("weight"))
        stale[key] = fuse_like_vllm(a, wrapped)[key]
        stale.pop(next(n for n in stale if "gate_up_proj" in n))
        cmp = compare_params(stale, b, a)
        res.check(
            f"dry_read_back_finds_stale_and_missing_{tag}",
            not cmp["ok"] and cmp["not_updated"] == [key] and len(cmp["hf_tensors_not_in_vllm"]) == 2,
            not_updated=cmp["not_updated"],
            missing=cmp["hf_tensors_not_in_vllm"],
        )

    # Full weights as the server path writes them: shards that load back into B.
    shard_dir = work / "shards"
    write_shards(refs.full_weights("B", "cpu"), shard_dir, 1 << 20)
    for f in ("config.json",):
        (shard_dir / f).write_bytes((refs.models / "B" / f).read_bytes())
    loaded = Qwen2ForCausalLM.from_pretrained(str(shard_dir), dtype=torch.bfloat16).eval()
    same = all(torch.equal(loaded.state_dict()[n], t) for n, t in refs.state["B"].items())
    res.check("dry_weight_shards_round_trip", same, shards=len(list(shard_dir.glob("*.safetensors"))))
    # A LoRA adapter as the engines write it: loads into peft and gives the reference output.
    path = write_adapter(refs.adapter("lora1"), refs.lora_spec(), work / "adapter")
    base = Qwen2ForCausalLM.from_pretrained(str(refs.models / "A"), dtype=torch.bfloat16)
    pm = PeftModel.from_pretrained(base, str(path)).eval()
    refs.model["lora1_written", "bf16"] = pm
    res.check("dry_written_adapter_matches_peft", refs.greedy("lora1_written") == refs.greedy("lora1"))


# ---------------------------------------------------------------------- driver


def merge(out: Path, main_res: Results) -> dict:
    merged = {"checks": {}, "errors": {}, "info": {}}
    for part in (out / "results_colocated.json", main_res.path):
        if part.exists():
            data = json.loads(part.read_text())
            for k in merged:
                merged[k].update(data.get(k, {}))
    return merged


def follow(path: Path, pos: int) -> int:
    """Print the CHECK/ERROR lines of the colocated part's log written since ``pos``."""
    if not path.exists():
        return pos
    with open(path, errors="replace") as f:
        f.seek(pos)
        chunk = f.read()
    done = chunk.rfind("\n") + 1
    for line in chunk[:done].splitlines():
        if "[colocated]" in line:
            print(line, flush=True)
    return pos + len(chunk[:done].encode())


def main(
    out_dir: str, models: str | None = None, deadline_s: float = 420.0, dry: bool = False, port: int = 8011
) -> int:
    t_start = time.time()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    models_dir = mcm.ensure(Path(models) if models else mcm.DEFAULT_DIR)
    log("models:", models_dir, f"(ready after {time.time() - t_start:.0f} s)")
    res = Results(out / "results.json", "[main]")
    work = Path(tempfile.mkdtemp(prefix="rlcore-vllm-gpu-"))
    if dry:
        res.info(dry_run=True)
        try:
            dry_run(res, Refs(models_dir, "cpu"), work)
        except Exception as exc:  # noqa: BLE001
            res.error("dry_run", exc)
        failed = [k for k, v in res.data["checks"].items() if not v["ok"]]
        log("dry run: failed checks:", failed, "errors:", list(res.data["errors"]))
        return 1 if failed or res.data["errors"] else 0

    def stop(signum, frame):  # a timeout's SIGTERM: still stop the children and merge the results
        raise KeyboardInterrupt(f"signal {signum}")

    old_handler = signal.signal(signal.SIGTERM, stop)
    server_log = out / "vllm_serve.log"
    colo_log = out / "colocated.log"
    (out / "results_colocated.json").unlink(missing_ok=True)
    proc = start_server(models_dir, port, server_log)
    child = subprocess.Popen(
        [sys.executable, __file__, str(out), "--part", "colocated", "--models", str(models_dir)],
        stdout=open(colo_log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log("started vllm serve (pid", proc.pid, ") and the colocated part (pid", child.pid, "); logs in", out)
    pos = 0
    try:
        try:
            refs = Refs(models_dir, "cuda")
            server(res, refs, f"http://127.0.0.1:{port}", proc, str(work / "sync"), server_log)
        except Exception as exc:  # noqa: BLE001
            res.error("server", exc)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
        while child.poll() is None and time.time() - t_start < deadline_s:
            pos = follow(colo_log, pos)
            time.sleep(2)
        pos = follow(colo_log, pos)
    except KeyboardInterrupt as exc:
        res.data["errors"]["interrupted"] = str(exc)
        res.save()
    finally:
        if child.poll() is None:
            res.data["errors"]["colocated_stopped"] = (
                f"the colocated part was still running after {time.time() - t_start:.0f} s and was stopped"
            )
            res.save()
            os.killpg(child.pid, signal.SIGTERM)
        for p in (proc, child):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        merged = merge(out, res)
        if (
            not any(k.startswith("colocated") for k in merged["checks"])
            and "colocated" not in merged["errors"]
        ):
            merged["errors"].setdefault("colocated", f"the colocated part wrote no results; see {colo_log}")
        merged["info"]["total_s"] = round(time.time() - t_start, 1)
        (out / "results.json").write_text(json.dumps(merged, indent=1, default=str))
        signal.signal(signal.SIGTERM, old_handler)
    failed = [k for k, v in merged["checks"].items() if not v["ok"]]
    log(
        f"{len(merged['checks'])} checks, failed:",
        failed,
        "errors:",
        list(merged["errors"]),
        f"total {merged['info']['total_s']} s",
    )
    return 1 if failed or merged["errors"].keys() - {"conformance"} else 0


def cli(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default=os.environ.get("OUT", "gpu-out"))
    ap.add_argument(
        "--models",
        default=None,
        help=f"models from make_check_models.py (default {mcm.DEFAULT_DIR}; built if missing)",
    )
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=420.0,
        help="stop the colocated part after this many seconds in all",
    )
    ap.add_argument("--dry-run", action="store_true", help="CPU only, no vLLM: models, helpers, weight files")
    ap.add_argument("--part", choices=["colocated"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.part == "colocated":
        return colocated_main(Path(args.out), Path(args.models))
    return main(args.out, args.models, args.deadline_s, args.dry_run)


if __name__ == "__main__":
    sys.exit(cli())
