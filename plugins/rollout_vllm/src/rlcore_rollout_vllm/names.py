"""The real argument names of vLLM at the supported versions, read from data files.

The files in ``data/`` were extracted from the released vLLM wheels (each file names its
version and source file), so ``rlcore validate`` can check engine arguments without importing
vLLM. At build time the installed vLLM's own names are checked too (:func:`live_engine_args`).
"""

from __future__ import annotations

from functools import cache

from rlcore.engine_kit.options import read_names

VERSIONS = ("0.26.0", "0.33.0")


@cache
def names(kind: str, version: str) -> frozenset[str]:
    """``kind`` is ``engine-args``, ``sampling-params`` or ``completion-request``."""
    return read_names("rlcore_rollout_vllm", f"vllm-{version}-{kind}.txt")


def engine_arg_versions() -> dict[str, list[str]]:
    """name -> the versions (of :data:`VERSIONS`) that accept it."""
    out: dict[str, list[str]] = {}
    for version in VERSIONS:
        for name in names("engine-args", version):
            out.setdefault(name, []).append(version)
    return out


def live_engine_args() -> frozenset[str] | None:
    """The installed vLLM's EngineArgs field names, or None when vLLM is not importable."""
    try:
        import dataclasses

        from vllm.engine.arg_utils import EngineArgs
    except Exception:  # noqa: BLE001 - absent or broken vLLM: the static lists decide
        return None
    return frozenset(f.name for f in dataclasses.fields(EngineArgs) if not f.name.startswith("_"))
