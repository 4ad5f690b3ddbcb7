"""SGLang 0.5.23's real argument names, read from data files (no SGLang import).

``data/`` holds the ``ServerArgs`` field names (= ``sglang.Engine(**kwargs)`` and the
``--kebab-case`` flags of ``sglang.launch_server``) and the ``SamplingParams`` names of the
released wheel; each file says where it was read from. (In 0.5.23 ``ServerArgs`` is assembled
from argument-group namespaces, so its names are not simply ``dataclasses.fields``; the installed
SGLang's own check runs when the engine starts, and its error is reported as a usage error.)
"""

from __future__ import annotations

from functools import cache

from rlcore.engine_kit.options import read_names
from rlcore_rollout_sglang import SGLANG_VERSION


@cache
def names(kind: str) -> frozenset[str]:
    """``kind`` is ``server-args`` or ``sampling-params``."""
    return read_names("rlcore_rollout_sglang", f"sglang-{SGLANG_VERSION}-{kind}.txt")
