"""Engine-independent pieces that rollout-engine plugins (vLLM, SGLang, ...) share.

Nothing here knows an engine's endpoints, field names or API: those stay in the plugins. The
modules import no torch at import time, so an engine's options can use them under ``rlcore validate``.
"""
