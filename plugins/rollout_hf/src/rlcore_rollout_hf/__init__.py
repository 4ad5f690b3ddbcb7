"""rlcore's embedded default rollout engine ``hf`` (see README.md).

Importing this package is cheap; the engine itself lives in :mod:`rlcore_rollout_hf.engine`.
"""

__version__ = "0.1.0"
