"""vLLM rollout engine for rlcore (``[rollout] engine = "vllm"``)."""

SUPPORTED_VLLM = ("0.26", "0.33")  # inclusive range of minor releases this plugin is written against
