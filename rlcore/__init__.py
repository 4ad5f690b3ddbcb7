"""rlcore: RL post-training for LLMs from one TOML manifest and pip-installable plugins."""

from rlcore.components import Component, NoOptions, Options
from rlcore.hookspecs import hookimpl

__version__ = "0.2.0"
__all__ = ["Component", "NoOptions", "Options", "hookimpl", "__version__"]
