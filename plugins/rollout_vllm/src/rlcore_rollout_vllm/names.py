"""The real argument names of vLLM at the supported versions, read from data files.

The files in ``data/`` were extracted from the released vLLM wheels (each file names its
version and source file), so ``rlcore validate`` can check engine arguments without importing
vLLM. At build time the installed vLLM's own names are checked too (:func:`live_engine_args`).
"""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files

from rlcore.errors import did_you_mean

VERSIONS = ("0.26.0", "0.33.0")


@lru_cache(maxsize=None)
def names(kind: str, version: str) -> frozenset[str]:
    """``kind`` is ``engine-args``, ``sampling-params`` or ``completion-request``."""
    text = (files("rlcore_rollout_vllm") / "data" / f"vllm-{version}-{kind}.txt").read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def engine_arg_versions() -> dict[str, list[str]]:
    """name -> the versions (of :data:`VERSIONS`) that accept it."""
    out: dict[str, list[str]] = {}
    for version in VERSIONS:
        for name in names("engine-args", version):
            out.setdefault(name, []).append(version)
    return out


def unknown_arg_message(key: str, known: set[str] | frozenset[str], where: str) -> str:
    hint = did_you_mean(key, known)
    msg = f"{key!r} is not an argument of {where}"
    if hint:
        msg += f"; did you mean {hint!r}?"
    return msg + ". Valid names: " + ", ".join(sorted(known))


def live_engine_args() -> frozenset[str] | None:
    """The installed vLLM's EngineArgs field names, or None when vLLM is not importable."""
    try:
        import dataclasses

        from vllm.engine.arg_utils import EngineArgs
    except Exception:  # noqa: BLE001 - absent or broken vLLM: the static lists decide
        return None
    return frozenset(f.name for f in dataclasses.fields(EngineArgs) if not f.name.startswith("_"))
