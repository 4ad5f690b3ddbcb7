"""rlcore-agent: multi-turn tool use for rlcore (the `tool` loop, the `python` and `function` tools)."""

__version__ = "0.1.0"
