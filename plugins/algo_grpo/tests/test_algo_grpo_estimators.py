"""grpo, dr_grpo, rloo and reinforce_pp against hand-computed values, plus the conformance kit."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlcore

torch = pytest.importorskip("torch")

from rlcore_algo_grpo import plugin  # noqa: E402

from rlcore.errors import ManifestError  # noqa: E402
from rlcore.interfaces import AdvantageInput  # noqa: E402
from rlcore.testing import isolated_registry, register, write_manifest  # noqa: E402
from rlcore.testing.algorithms import check_advantage_estimator  # noqa: E402
from rlcore.testing.runs import load_run_manifest  # noqa: E402

NAN = float("nan")


def _registry():
    registry = isolated_registry()
    register(registry, plugin, name="algo_grpo", distribution="rlcore-algo-grpo")
    return registry


def build(name: str, options=None):
    return _registry().get("advantage_estimator", name).build(options or {})


def close(actual, expected, tol=1e-5):
    return torch.allclose(actual.float(), torch.as_tensor(expected, dtype=torch.float32), atol=tol, rtol=tol)


# Six samples: group 0 = {1, 0, 0}, group 1 = {0.5, 0.5} (all equal), group 2 = {2} (single).
# Rows are padded differently; row 5 has no model token at all.
SCORES = [1.0, 0.0, 0.0, 0.5, 0.5, 2.0]
GROUPS = [10, 10, 10, 3, 3, 99]
MASK = [
    [1, 1, 1],
    [1, 1, 0],
    [1, 0, 0],
    [1, 1, 1],
    [0, 1, 1],
    [0, 0, 0],
]


def outcome_batch() -> AdvantageInput:
    mask = torch.tensor(MASK, dtype=torch.float32)
    rewards = torch.full(mask.shape, NAN)  # outcome estimators read scores, never token rewards
    return AdvantageInput(torch.tensor(SCORES), rewards, mask, torch.tensor(GROUPS))


def per_row(adv: torch.Tensor) -> list[float]:
    """The value each row carries on its model tokens (checking it is the same on all of them)."""
    mask = torch.tensor(MASK, dtype=torch.bool)
    out = []
    for row in range(adv.shape[0]):
        vals = adv[row][mask[row]]
        assert (adv[row][~mask[row]] == 0).all()
        assert (vals == vals[0]).all() if len(vals) else True
        out.append(float(vals[0]) if len(vals) else 0.0)
    return out


def test_grpo_by_hand():
    adv, returns = build("grpo")(outcome_batch())
    # group 10: mean 1/3; deviations 2/3, -1/3, -1/3; unbiased var (4/9 + 1/9 + 1/9) / 2 = 1/3
    # std = 0.57735 -> advantages 1.1547, -0.57735, -0.57735 (epsilon 1e-6 is negligible)
    # group 3 (all equal) and group 99 (single sample): 0
    s = math.sqrt(1 / 3)
    assert close(torch.tensor(per_row(adv)), [(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, 0, 0, 0], 1e-4)
    # returns: each row's score on its model tokens
    assert close(returns, torch.tensor(SCORES)[:, None] * torch.tensor(MASK))


def test_grpo_without_std_equals_dr_grpo():
    a, _ = build("grpo", {"norm_by_std": False})(outcome_batch())
    b, _ = build("dr_grpo")(outcome_batch())
    # group 10: 1 - 1/3, 0 - 1/3, 0 - 1/3; others 0
    assert close(torch.tensor(per_row(b)), [2 / 3, -1 / 3, -1 / 3, 0, 0, 0])
    assert torch.equal(a, b)


def test_grpo_epsilon_matters_for_tiny_spread():
    batch = AdvantageInput(
        torch.tensor([0.0, 1e-6]), torch.zeros(2, 1), torch.ones(2, 1), torch.tensor([0, 0])
    )
    # deviations -+5e-7, unbiased std 7.071e-7; with epsilon 1: adv = 5e-7 / (1 + 7.07e-7) ~ 5e-7
    adv, _ = build("grpo", {"epsilon": 1.0})(batch)
    assert close(adv[:, 0], [-5e-7, 5e-7], 1e-9)


def test_rloo_by_hand():
    adv, _ = build("rloo")(outcome_batch())
    # group 10: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5; same for the third; others 0
    assert close(torch.tensor(per_row(adv)), [1.0, -0.5, -0.5, 0, 0, 0])


def test_reinforce_pp_by_hand():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, -0.5, 7.0]])  # 7 sits on padding after the last token:
    # it is credited to the last model token (position 1) -> row 1 rewards [0, 6.5]
    batch = AdvantageInput(torch.tensor([1.0, 6.5]), rewards, mask, torch.tensor([0, 0]))
    adv, ret = build("reinforce_pp")(batch)
    # gamma 1: returns row 0 [1, 1, 1], row 1 [6.5, 6.5, 0]
    assert close(ret, [[1, 1, 1], [6.5, 6.5, 0]])
    # whitened over 5 tokens {1, 1, 1, 6.5, 6.5}: mean 3.2; deviations -2.2 x3, 3.3 x2;
    # unbiased var (3 * 4.84 + 2 * 10.89) / 4 = 9.075; std 3.01247
    std = math.sqrt(9.075)
    assert close(adv, [[-2.2 / std] * 3, [3.3 / std, 3.3 / std, 0]], 1e-4)

    _, ret_g = build("reinforce_pp", {"gamma": 0.5})(batch)
    # gamma 0.5: row 0 [0.25, 0.5, 1]; row 1 [3.25, 6.5, 0]
    assert close(ret_g, [[0.25, 0.5, 1], [3.25, 6.5, 0]])


def test_reinforce_pp_all_equal_and_empty():
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    rewards = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # every return is 1: whitened advantages are 0
    adv, ret = build("reinforce_pp")(AdvantageInput(torch.ones(2), rewards, mask, torch.tensor([0, 1])))
    assert torch.equal(adv, torch.zeros(2, 2)) and close(ret, [[1, 1], [1, 0]])
    empty = AdvantageInput(torch.ones(2), rewards, torch.zeros(2, 2), torch.tensor([0, 1]))
    adv, ret = build("reinforce_pp")(empty)
    assert torch.equal(adv, torch.zeros(2, 2)) and torch.equal(ret, torch.zeros(2, 2))


@pytest.mark.parametrize(
    "name, options",
    [
        ("grpo", {}),
        ("grpo", {"norm_by_std": False, "epsilon": 0.01}),
        ("dr_grpo", {}),
        ("rloo", {}),
        ("reinforce_pp", {}),
        ("reinforce_pp", {"gamma": 0.9}),
    ],
)
def test_conformance(name, options):
    check_advantage_estimator(_registry().get("advantage_estimator", name), options)


def test_conformance_kit_catches_a_leaky_estimator():
    def leaky(batch):  # forgets the mask
        adv = batch.scores[:, None].expand(batch.response_mask.shape).clone()
        return adv, adv

    with pytest.raises(AssertionError, match="outside the response mask"):
        check_advantage_estimator(leaky)


def test_bad_shapes_are_named():
    batch = outcome_batch()
    batch.group_ids = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="group_ids"):
        build("grpo")(batch)


class _Engine:
    """Stands in for the rollout engine plugin so the manifest selects a registered engine."""

    @staticmethod
    @rlcore.hookimpl
    def rlcore_rollout_engines():
        from rlcore.components import Component

        return [Component("hf", lambda options, context: None, default=True)]  # the default engine


def test_options_validated_through_the_manifest(tmp_path):
    registry = _registry()
    register(registry, _Engine(), name="engine")
    doc = {
        "model": {"path": "m"},
        "data": {"train": "synthetic:addition"},
        "reward": {"function": "python:r.py:f"},
        "trainer": {"steps": 1},
        "algorithm": {"advantage": "reinforce_pp", "gamma": 1.5},
    }
    (tmp_path / "r.py").write_text("def f(x):\n    return 0.0\n")
    with pytest.raises(ManifestError, match="algorithm.gamma"):
        load_run_manifest(write_manifest(tmp_path, doc), registry=registry, environ={})
    doc["algorithm"]["gamma"] = 0.9
    resolved = load_run_manifest(write_manifest(tmp_path, doc), registry=registry, environ={})
    assert resolved.component("algorithm.advantage").options.gamma == 0.9


def test_plugin_module_imports_no_torch():
    code = "import sys, rlcore_algo_grpo.plugin; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


@settings(max_examples=40, deadline=None)
@given(
    scores=st.lists(st.floats(-5, 5, allow_nan=False, width=32), min_size=1, max_size=12),
    data=st.data(),
)
def test_centred_estimators_sum_to_zero_within_each_group(scores, data):
    """Property: every group's (per-sample) advantages sum to 0 for grpo, dr_grpo and rloo."""
    groups = data.draw(st.lists(st.integers(0, 3), min_size=len(scores), max_size=len(scores)))
    batch = AdvantageInput(
        torch.tensor(scores), torch.zeros(len(scores), 2), torch.ones(len(scores), 2), torch.tensor(groups)
    )
    for name in ("grpo", "dr_grpo", "rloo"):
        adv, _ = build(name)(batch)
        assert torch.isfinite(adv).all()
        for g in set(groups):
            rows = torch.tensor(groups) == g
            assert abs(float(adv[rows, 0].sum())) < 1e-3 * max(1.0, float(adv[rows, 0].abs().sum())), (
                name,
                g,
            )
