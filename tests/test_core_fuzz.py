"""Property-based: whatever TOML document `validate` reads, it answers without a traceback."""

from __future__ import annotations

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlcore.cli import main

TABLES = [
    "run",
    "model",
    "data",
    "rollout",
    "reward",
    "algorithm",
    "critic",
    "trainer",
    "agent",
    "tools",
    "loggers",
    "launcher",
    "junk",
]
KEYS = [
    "name",
    "seed",
    "path",
    "dtype",
    "train",
    "val",
    "engine",
    "temperature",
    "function",
    "advantage",
    "policy_loss",
    "steps",
    "lr",
    "loggers",
    "lora",
    "rank",
    "samples_per_prompt",
    "max_response_tokens",
    "kl_coef",
    "x",
    "tools",
    "python",
    "console",
    "gguf_file",
    "output_dir",
    "device",
    "loop",
    "timeout_s",
]

scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(
        ["hf", "grpo", "ppo_clip", "exact_match", "console", "local", "synthetic:addition", "float32"]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)
    ),
    max_leaves=8,
)
documents = st.dictionaries(
    st.sampled_from(TABLES),
    st.one_of(st.dictionaries(st.sampled_from(KEYS), values, max_size=6), scalars),
    max_size=8,
)


def _check(tmp_path, capsys, text: str) -> None:
    path = tmp_path / "fuzz.toml"
    path.write_text(text, encoding="utf-8")
    rc = main(["validate", str(path)])
    out = capsys.readouterr()
    assert rc in (0, 2), out
    assert "Traceback" not in out.out + out.err
    assert "unexpected error" not in out.out + out.err


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(documents)
def test_structured_documents_never_give_a_traceback(tmp_path, capsys, document):
    _check(tmp_path, capsys, tomli_w.dumps(document))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.sampled_from(list("[]=\"'.,{}#\n abc123_-+:")), max_size=80))
def test_arbitrary_text_never_gives_a_traceback(tmp_path, capsys, text):
    _check(tmp_path, capsys, text)
