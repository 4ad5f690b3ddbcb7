"""SGLang rollout engine for rlcore (``[rollout] engine = "sglang"``)."""

SGLANG_VERSION = (
    "0.5.23"  # the release whose argument names are in data/ and whose API this plugin is written against
)
