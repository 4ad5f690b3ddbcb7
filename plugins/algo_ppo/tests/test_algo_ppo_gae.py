"""GAE against hand-computed values, masked gaps and padding, and the conformance kit."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from rlcore_algo_ppo import plugin  # noqa: E402

from rlcore.algorithms import masked_whiten  # noqa: E402
from rlcore.interfaces import AdvantageInput  # noqa: E402
from rlcore.testing import isolated_registry, register  # noqa: E402
from rlcore.testing.algorithms import check_advantage_estimator  # noqa: E402

NAN = float("nan")


def component():
    registry = isolated_registry()
    register(registry, plugin, name="algo_ppo", distribution="rlcore-algo-ppo")
    return registry.get("advantage_estimator", "gae")


def gae(options=None):
    return component().build({"whiten": False, **(options or {})})


def close(actual, expected, tol=1e-5):
    return torch.allclose(actual.float(), torch.as_tensor(expected, dtype=torch.float32), atol=tol, rtol=tol)


def batch(rewards, values, mask) -> AdvantageInput:
    mask = torch.tensor(mask, dtype=torch.float32)
    return AdvantageInput(
        torch.zeros(mask.shape[0]),
        torch.tensor(rewards),
        mask,
        torch.arange(mask.shape[0]),
        torch.tensor(values),
    )


def test_gae_needs_a_critic():
    assert component().needs == frozenset({"critic"})


def test_gae_lambda_1_is_monte_carlo_minus_value():
    # r = [0, 0, 1], V = [0.5, 0.2, 0.8], gamma = lam = 1
    # t2: delta = 1 - 0.8 = 0.2; A2 = 0.2
    # t1: delta = 0 + 0.8 - 0.2 = 0.6; A1 = 0.6 + 0.2 = 0.8
    # t0: delta = 0 + 0.2 - 0.5 = -0.3; A0 = -0.3 + 0.8 = 0.5   (= 1 - V_t)
    adv, ret = gae()(batch([[0.0, 0.0, 1.0]], [[0.5, 0.2, 0.8]], [[1, 1, 1]]))
    assert close(adv, [[0.5, 0.8, 0.2]])
    assert close(ret, [[1.0, 1.0, 1.0]])  # A + V


def test_gae_gamma_lambda_by_hand():
    # gamma 0.9, lam 0.5 (gamma * lam = 0.45)
    # t2: delta = 1 - 0.8 = 0.2; A2 = 0.2
    # t1: delta = 0.9 * 0.8 - 0.2 = 0.52; A1 = 0.52 + 0.45 * 0.2 = 0.61
    # t0: delta = 0.9 * 0.2 - 0.5 = -0.32; A0 = -0.32 + 0.45 * 0.61 = -0.0455
    # returns = A + V = [0.4545, 0.81, 1.0]
    adv, ret = gae({"gamma": 0.9, "lam": 0.5})(batch([[0.0, 0.0, 1.0]], [[0.5, 0.2, 0.8]], [[1, 1, 1]]))
    assert close(adv, [[-0.0455, 0.61, 0.2]])
    assert close(ret, [[0.4545, 0.81, 1.0]])


def test_gae_skips_masked_gaps_and_padding_values_never_leak():
    # The same three model tokens at positions 0, 2, 3 with tool output at 1 and padding at 4;
    # NaN critic values there, and the score on the padding position (credited to position 3).
    b = batch([[0.0, 0.0, 0.0, 0.0, 1.0]], [[0.5, NAN, 0.2, 0.8, NAN]], [[1, 0, 1, 1, 0]])
    adv, ret = gae({"gamma": 0.9, "lam": 0.5})(b)
    assert close(adv, [[-0.0455, 0.0, 0.61, 0.2, 0.0]])
    assert close(ret, [[0.4545, 0.0, 0.81, 1.0, 0.0]])


def test_gae_whiten_and_all_zero_rows():
    b = batch(
        [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0]],
        [[0.1, 0.2, 0.3], [NAN, NAN, NAN], [0.5, 0.0, 0.0]],
        [[1, 1, 0], [0, 0, 0], [1, 0, 0]],
    )
    raw, ret = gae()(b)
    # row 0: t1: A = 1 - 0.2 = 0.8; t0: delta = 0.2 - 0.1 = 0.1, A = 0.1 + 0.8 = 0.9
    # row 1: no model token -> 0; row 2: A = 2 - 0.5 = 1.5
    assert close(raw, [[0.9, 0.8, 0.0], [0, 0, 0], [1.5, 0, 0]])
    white, ret_w = component().build({})(b)
    assert close(white, masked_whiten(raw, b.response_mask))
    assert torch.equal(ret, ret_w)  # returns are never whitened
    assert abs(float(white[b.response_mask.bool()].mean())) < 1e-6


def test_gae_without_values_is_a_clear_error():
    b = batch([[1.0]], [[0.0]], [[1]])
    b.values = None
    with pytest.raises(ValueError, match="critic values"):
        gae()(b)


@pytest.mark.parametrize("options", [{}, {"gamma": 0.99, "lam": 0.95}, {"whiten": False, "lam": 0.0}])
def test_conformance(options):
    check_advantage_estimator(component(), options)


def test_deterministic():
    b = batch([[0.0, 0.3, 1.0]], [[0.5, 0.2, 0.8]], [[1, 1, 1]])
    first = component().build({})(b)
    second = component().build({})(b)
    assert all(torch.equal(x, y) for x, y in zip(first, second))


def test_options_rejected():
    with pytest.raises(Exception, match="lam"):
        component().options.model_validate({"lam": 1.5})


def test_plugin_module_imports_no_torch():
    code = "import sys, rlcore_algo_ppo.plugin; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
