"""SGLang's control calls answer in several shapes; one place decides success or failure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlcore.errors import RlcoreError


def check(result: Any, what: str) -> None:
    """Raise when ``result`` reports a failure: a ``(success, message, ...)`` tuple
    (update_weights_from_tensor / _from_disk), an object or dict with ``success`` and
    ``message`` / ``error_message`` (LoRA load/unload), or None (memory release: no news)."""
    if result is None:
        return
    if isinstance(result, tuple) and result and isinstance(result[0], bool):
        ok, message = result[0], (result[1] if len(result) > 1 else "")
    elif isinstance(result, Mapping):
        ok, message = result.get("success", True), result.get("message") or result.get("error_message") or ""
    else:
        ok = getattr(result, "success", True)
        message = getattr(result, "message", None) or getattr(result, "error_message", None) or ""
    if not ok:
        raise RlcoreError(f"{what} failed: {message or result!r}")
