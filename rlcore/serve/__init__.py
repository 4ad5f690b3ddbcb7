"""``rlcore serve``: a manifest's rollout engine behind an OpenAI-compatible HTTP API
(:mod:`rlcore.serve.app`), started by :mod:`rlcore.serve.cli`."""
