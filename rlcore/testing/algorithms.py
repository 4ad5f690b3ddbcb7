"""Conformance kits for advantage estimators and policy losses.

Call them from any plugin's tests; each raises ``AssertionError`` naming the case that failed::

    from rlcore.testing.algorithms import check_advantage_estimator, check_policy_loss
    from rlcore_my_algo.plugin import rlcore_advantage_estimators

    def test_my_estimator_conforms():
        (component,) = rlcore_advantage_estimators()
        check_advantage_estimator(component, {"gamma": 0.9})

``component`` is a :class:`rlcore.components.Component` record (built with ``options``, which
may be a dict or an options instance) or an already built callable. An estimator whose record
declares ``needs={"critic"}`` (or any callable, with ``needs_values=True``) is given values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlcore.components import Component
from rlcore.interfaces import AdvantageInput, BuildContext, PolicyLossInput

# Values put on masked positions to check that they never leak into results.
_GARBAGE_VALUES = (float("nan"), float("inf"), 1e6)


def _build(component: Component | Callable, options: Any) -> tuple[Callable, frozenset[str]]:
    if isinstance(component, Component):
        return component.build(options, BuildContext()), component.needs
    if options is not None:
        raise TypeError("options are only used with a Component record; pass the built callable alone")
    return component, frozenset()


def _mask(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def _advantage_cases(generator: torch.Generator) -> dict[str, AdvantageInput]:
    """Named edge cases. Scores sit on each row's last model token of token_rewards."""

    def make(
        scores: list[float], groups: list[int], mask: torch.Tensor, extra_rewards: bool = False
    ) -> AdvantageInput:
        s = torch.tensor(scores, dtype=torch.float32)
        rewards = torch.zeros_like(mask)
        for row in range(mask.shape[0]):
            valid = mask[row].nonzero().flatten()
            if len(valid):
                rewards[row, valid[-1]] = s[row]
        if extra_rewards:  # a per-token penalty, as a KL-in-reward would add
            rewards = rewards - 0.01 * torch.rand(mask.shape, generator=generator) * mask
        values = torch.randn(mask.shape, generator=generator) * mask
        return AdvantageInput(
            scores=s,
            token_rewards=rewards,
            response_mask=mask,
            group_ids=torch.tensor(groups, dtype=torch.long),
            values=values,
        )

    padded = _mask(
        [
            [1, 1, 1, 1, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 1],
            [1, 0, 1, 1, 0, 0],  # a gap (tool output) between model tokens
            [0, 1, 1, 1, 1, 0],
            [1, 1, 1, 0, 0, 0],
        ]
    )
    return {
        "mixed groups with padding": make(
            [1.0, 0.0, 0.5, 1.0, 0.0, 0.25], [7, 7, 7, 42, 42, 42], padded, True
        ),
        "a group whose rewards are all equal": make(
            [1.0, 1.0, 1.0, 0.0, 1.0, 0.0], [0, 0, 0, 1, 1, 1], padded
        ),
        "every reward equal": make([0.5] * 6, [0, 0, 0, 1, 1, 1], padded),
        "single-sample groups": make([1.0, 0.0, 0.3], [3, 1, 2], padded[:3]),
        "a row with an all-zero mask": make(
            [1.0, 0.0, 1.0], [0, 0, 0], _mask([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
        ),
        "an all-zero mask": make([1.0, 0.0], [0, 0], torch.zeros(2, 4)),
        "one token": make([1.0, 0.0], [0, 0], _mask([[1], [1]])),
    }


def _with_garbage(batch: AdvantageInput, garbage: float, needs_values: bool) -> AdvantageInput:
    """The same batch with ``garbage`` in the critic values at masked positions."""
    masked_out = batch.response_mask == 0
    values = batch.values.masked_fill(masked_out, garbage) if needs_values else None
    return AdvantageInput(
        batch.scores.clone(),
        batch.token_rewards.clone(),
        batch.response_mask.clone(),
        batch.group_ids.clone(),
        values,
    )


def _clone(batch: AdvantageInput, needs_values: bool) -> AdvantageInput:
    return AdvantageInput(
        batch.scores.clone(),
        batch.token_rewards.clone(),
        batch.response_mask.clone(),
        batch.group_ids.clone(),
        batch.values.clone() if needs_values else None,
    )


def check_advantage_estimator(
    component: Component | Callable, options: Any = None, *, needs_values: bool | None = None
) -> None:
    """Shapes [B, T]; exactly 0 outside the mask; finite on edge cases (all-equal groups,
    single-sample groups, empty masks); deterministic; inputs untouched; equivariant to
    reordering the batch; critic values on masked positions (NaN, inf) never leak."""
    estimator, needs = _build(component, options)
    if needs_values is None:
        needs_values = "critic" in needs
    generator = torch.Generator().manual_seed(0)
    for name, batch in _advantage_cases(generator).items():
        batch = _clone(batch, needs_values)
        before = _clone(batch, needs_values)
        out = estimator(batch)
        assert isinstance(out, tuple) and len(out) == 2, (
            f"{name}: expected (advantages, returns), got {type(out).__name__}"
        )
        shape = tuple(batch.response_mask.shape)
        for label, tensor in zip(("advantages", "returns"), out):
            assert isinstance(tensor, torch.Tensor), f"{name}: {label} is not a tensor"
            assert tuple(tensor.shape) == shape, (
                f"{name}: {label} has shape {tuple(tensor.shape)}, expected {shape}"
            )
            assert tensor.is_floating_point(), f"{name}: {label} must be floating point, got {tensor.dtype}"
            assert torch.isfinite(tensor).all(), f"{name}: {label} has non-finite entries: {tensor}"
            outside = tensor[batch.response_mask == 0]
            assert (outside == 0).all(), f"{name}: {label} is not 0 outside the response mask: {tensor}"
        for field in ("scores", "token_rewards", "response_mask", "group_ids") + (
            ("values",) if needs_values else ()
        ):
            assert torch.equal(getattr(batch, field), getattr(before, field)), (
                f"{name}: the estimator modified {field}"
            )
        again = estimator(_clone(batch, needs_values))
        for label, first, second in zip(("advantages", "returns"), out, again):
            assert torch.equal(first, second), f"{name}: {label} differ between two identical calls"
        for garbage in _GARBAGE_VALUES if needs_values else ():
            dirty = estimator(_with_garbage(batch, garbage, needs_values))
            for label, clean, d in zip(("advantages", "returns"), out, dirty):
                assert torch.allclose(clean, d, atol=1e-6, equal_nan=False), (
                    f"{name}: critic values of {garbage} on masked positions changed the {label}"
                )
        order = torch.randperm(shape[0], generator=generator)
        permuted = AdvantageInput(
            batch.scores[order],
            batch.token_rewards[order],
            batch.response_mask[order],
            batch.group_ids[order],
            batch.values[order] if needs_values else None,
        )
        p_out = estimator(permuted)
        for label, first, second in zip(("advantages", "returns"), out, p_out):
            assert torch.allclose(first[order], second, atol=1e-5), (
                f"{name}: reordering the batch changed the {label} (results must depend on groups, not positions)"
            )
    if needs_values:
        batch = _advantage_cases(generator)["mixed groups with padding"]
        try:
            estimator(
                AdvantageInput(batch.scores, batch.token_rewards, batch.response_mask, batch.group_ids, None)
            )
        except (ValueError, TypeError) as exc:
            assert "value" in str(exc).lower(), f"missing values gave an error that does not say so: {exc}"
        else:
            raise AssertionError("an estimator that needs a critic accepted values=None silently")


def _policy_batch(generator: torch.Generator, constant_advantage: bool = False) -> PolicyLossInput:
    mask = _mask(
        [
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 1],
            [1, 0, 1, 1, 0, 0],
            [0, 0, 0, 0, 0, 0],
        ]
    )
    shape = mask.shape
    old = -torch.rand(shape, generator=generator) * 3
    logprobs = (old + 0.3 * torch.randn(shape, generator=generator)).clamp(max=0)
    if constant_advantage:
        advantages = torch.tensor([[1.0], [-0.5], [2.0], [1.0]]).expand(shape).clone()
    else:
        advantages = torch.randn(shape, generator=generator)
    rollout = old + 0.05 * torch.randn(shape, generator=generator)
    return PolicyLossInput(
        logprobs=(logprobs * mask).requires_grad_(True),
        old_logprobs=old * mask,
        advantages=advantages * mask,
        response_mask=mask,
        rollout_logprobs=rollout * mask,
    )


def _run_loss(loss_fn: Callable, batch: PolicyLossInput, name: str) -> tuple[torch.Tensor, dict[str, Any]]:
    out = loss_fn(batch)
    assert isinstance(out, tuple) and len(out) == 2, (
        f"{name}: expected (per_token_loss, metrics), got {type(out).__name__}"
    )
    loss, metrics = out
    shape = tuple(batch.response_mask.shape)
    assert isinstance(loss, torch.Tensor) and tuple(loss.shape) == shape, (
        f"{name}: the per-token loss must be a tensor of shape {shape}, got {getattr(loss, 'shape', type(loss))}"
    )
    valid = batch.response_mask != 0
    assert torch.isfinite(loss[valid]).all(), f"{name}: the loss is not finite on valid tokens: {loss}"
    assert isinstance(metrics, dict), f"{name}: metrics must be a dict, got {type(metrics).__name__}"
    for key, value in metrics.items():
        assert isinstance(key, str), f"{name}: metric name {key!r} is not a string"
        assert isinstance(value, torch.Tensor) and value.dim() == 0, (
            f"{name}: metric {key!r} is not a scalar tensor: {value!r}"
        )
        assert torch.isfinite(value), f"{name}: metric {key!r} is not finite: {value}"
        assert not value.requires_grad, (
            f"{name}: metric {key!r} requires grad (detach it; logging would keep the graph)"
        )
    return loss, metrics


def _token_mean(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask != 0, loss, torch.zeros_like(loss)).sum() / (mask != 0).sum().clamp(min=1)


def check_policy_loss(component: Component | Callable, options: Any = None) -> None:
    """Shape [B, T]; finite; differentiable with finite gradients; metrics are detached scalar
    tensors; deterministic; masked positions do not change valid tokens' losses; zero advantages
    give a zero gradient; at ratio 1 a positive advantage raises a token's log-prob."""
    loss_fn, _ = _build(component, options)
    generator = torch.Generator().manual_seed(0)
    batch = _policy_batch(generator)
    mask = batch.response_mask
    valid = mask != 0

    loss, _ = _run_loss(loss_fn, batch, "random batch")
    _token_mean(loss, mask).backward()
    grad = batch.logprobs.grad
    assert grad is not None, "random batch: no gradient reached logprobs"
    assert torch.isfinite(grad).all(), f"random batch: non-finite gradient {grad}"
    assert grad[valid].abs().sum() > 0, "random batch: the gradient is zero everywhere"

    again, _ = _run_loss(
        loss_fn,
        PolicyLossInput(
            batch.logprobs.detach().clone().requires_grad_(True),
            batch.old_logprobs.clone(),
            batch.advantages.clone(),
            mask.clone(),
            batch.rollout_logprobs.clone(),
        ),
        "repeat",
    )
    assert torch.equal(loss.detach(), again.detach()), "two identical calls gave different losses"

    no_rollout = PolicyLossInput(
        batch.logprobs.detach().clone().requires_grad_(True), batch.old_logprobs, batch.advantages, mask, None
    )
    _run_loss(loss_fn, no_rollout, "rollout_logprobs=None")

    # Padding may hold anything finite: valid tokens' losses must not change.
    noise = 5 * torch.randn(mask.shape, generator=generator)
    dirty = PolicyLossInput(
        torch.where(valid, batch.logprobs.detach(), -noise.abs()).requires_grad_(True),
        torch.where(valid, batch.old_logprobs, noise.abs() * -2),
        torch.where(valid, batch.advantages, noise),
        mask,
        torch.where(valid, batch.rollout_logprobs, noise),
    )
    dirty_loss, _ = _run_loss(loss_fn, dirty, "values on padded positions")
    assert torch.allclose(dirty_loss.detach()[valid], loss.detach()[valid], atol=1e-6), (
        "values on masked positions changed the loss of valid tokens"
    )

    zero = PolicyLossInput(
        batch.logprobs.detach().clone().requires_grad_(True),
        batch.old_logprobs,
        torch.zeros_like(batch.advantages),
        mask,
        batch.rollout_logprobs,
    )
    zero_loss, _ = _run_loss(loss_fn, zero, "zero advantages")
    _token_mean(zero_loss, mask).backward()
    assert zero.logprobs.grad is None or torch.count_nonzero(zero.logprobs.grad) == 0, (
        f"zero advantages gave a non-zero gradient: {zero.logprobs.grad}"
    )

    on_policy = _policy_batch(generator, constant_advantage=True)
    same = PolicyLossInput(
        on_policy.old_logprobs.clone().requires_grad_(True),
        on_policy.old_logprobs,
        on_policy.advantages,
        on_policy.response_mask,
        on_policy.old_logprobs.clone(),
    )
    same_loss, _ = _run_loss(loss_fn, same, "ratio 1")
    _token_mean(same_loss, same.response_mask).backward()
    g = same.logprobs.grad
    ok = same.response_mask != 0
    assert g is not None and torch.equal(torch.sign(g[ok]), -torch.sign(same.advantages[ok])), (
        "at ratio 1 the gradient must lower the loss by raising log-probs of positive-advantage tokens "
        f"(grad {g}, advantages {same.advantages})"
    )
