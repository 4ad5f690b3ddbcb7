"""Moving from verl to rlcore: ``rlcore from-verl`` (registered by :mod:`rlcore_verl.plugin`)."""

__version__ = "0.1.0"
