"""Datasets: loading prompts (verl's row format or synthetic tasks), GSM8K conversion, synthetic tasks.

Nothing here imports torch; ``datasets`` and ``pyarrow`` load only when a file is read or written.
"""

from rlcore.data.prompts import PromptSet, check_data_spec, load_prompts
from rlcore.data.synthetic import TASKS, write_synthetic

__all__ = ["PromptSet", "TASKS", "check_data_spec", "load_prompts", "write_synthetic"]
