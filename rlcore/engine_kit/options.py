"""Checks that every rollout engine's manifest options share, so ``rlcore validate`` rejects a
bad ``[rollout]`` the same way whatever the engine.

Engines keep their own lists of real argument names (read from data files extracted from the
released wheels, so no engine is imported): :func:`read_names` loads one,
:func:`check_engine_args` checks ``engine_args`` keys against it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from importlib.resources import files
from typing import Any

from rlcore.errors import UsageError, did_you_mean


def read_names(package: str, filename: str) -> frozenset[str]:
    """The names in ``<package>/data/<filename>``: one a line, ``#`` lines are comments."""
    text = (files(package) / "data" / filename).read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def unknown_name_message(key: str, known: Collection[str], where: str) -> str:
    """``'kye' is not an argument of WHERE; did you mean 'key'? Valid names: ...``"""
    msg = f"{key!r} is not an argument of {where}"
    hint = did_you_mean(key, known)
    if hint:
        msg += f"; did you mean {hint!r}?"
    return msg + ". Valid names: " + ", ".join(sorted(known))


def check_engine_args(
    engine_args: Mapping[str, Any], *, known: Collection[str], own_fields: Mapping[str, str], where: str
) -> None:
    """Raise ValueError (a pydantic validator's error) for keys that have their own option
    (``own_fields``: engine name -> the option to set instead, so each is set in one place) and
    for keys the engine does not know, every problem in one message."""
    problems = []
    for key in engine_args:
        if key in own_fields:
            problems.append(f"{key!r} has its own option: set rollout.{own_fields[key]} instead")
        elif key not in known:
            problems.append(unknown_name_message(key, known, where))
    if problems:
        raise ValueError("; ".join(problems))


def check_server_urls(urls: Iterable[str], example: str) -> list[str]:
    """Base URLs, each once, without a trailing slash; ``example`` is shown for a bad one."""
    urls = list(urls)
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"server {url!r} must be a base URL such as {example}")
    if len(set(urls)) != len(urls):
        raise ValueError("a server is listed twice")
    return [u.rstrip("/") for u in urls]


def check_mode(mode: str, servers: Collection[str]) -> None:
    """``servers`` are needed by, and only used with, ``mode = 'server'``."""
    if mode == "server" and not servers:
        raise ValueError("mode = 'server' needs servers = ['http://HOST:PORT', ...]")
    if mode == "colocated" and servers:
        raise ValueError("servers are only used with mode = 'server'")


def colocated_model(model: str | None, context: Any, engine: str) -> str:
    """The model directory an in-process engine loads: ``rollout.model``, else ``[model] path``.
    Engines that load Hugging Face directories refuse a GGUF file, pointing to the hf engine."""
    model = model or context.model_path
    if not model:
        raise UsageError(f"the {engine} engine needs a model: set [model] path (or rollout.model)")
    if context.gguf_file:
        raise UsageError(
            f"the {engine} engine loads Hugging Face directories; [model] gguf_file is not supported, use the hf engine"
        )
    return model
