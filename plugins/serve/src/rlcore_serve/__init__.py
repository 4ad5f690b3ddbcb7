"""``rlcore serve``: a manifest's rollout engine behind an OpenAI-compatible HTTP API
(:mod:`rlcore_serve.app`), started by :mod:`rlcore_serve.cli`."""
