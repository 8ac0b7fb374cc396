"""AdamW with warmup and a schedule, the clipped step (norm before clipping), and the non-finite loss refusal."""

from __future__ import annotations

import math

import pytest
import torch

from common.minimind.precision import resolve_precision
from opd.config import OptimConfig
from opd.training.optimization import Optimization

CPU = resolve_precision("cpu", "float32")


def optimization(scheduler: str, warmup: int, clip: float | None = 1.0, steps: int = 10):
    model = torch.nn.Linear(3, 1, bias=False)
    return model, Optimization(model, OptimConfig(0.1, 0.0, scheduler, warmup, None, clip), steps, CPU)


def test_warmup_then_cosine_and_constant_learning_rates():
    _, cosine = optimization("cosine", 2)
    rates = []
    for _ in range(10):
        rates.append(cosine.lr)
        cosine.step()
    expected = [0.0, 0.05] + [0.1 * 0.5 * (1 + math.cos(math.pi * (s - 2) / 8)) for s in range(2, 10)]
    assert rates == pytest.approx(expected)
    _, constant = optimization("constant", 1)
    rates = []
    for _ in range(3):
        rates.append(constant.lr)
        constant.step()
    assert rates == pytest.approx([0.0, 0.1, 0.1])


def test_step_returns_the_norm_before_clipping_and_clips_to_grad_clip():
    model, clipped = optimization("constant", 0, clip=1.0)
    model.weight.data.zero_()
    model(torch.tensor([[3.0, 4.0, 0.0]])).sum().backward()  # gradient (3, 4, 0): norm 5
    grad_norm = clipped.step()
    assert grad_norm == pytest.approx(5.0)
    # AdamW's first step moves each weight by lr whatever the gradient's size; the clip shows in the moments
    assert clipped.optimizer.state[model.weight]["exp_avg"].norm().item() == pytest.approx(0.1 * 1.0, rel=1e-5)
    assert model.weight.grad is None  # cleared after the step


def test_a_non_finite_loss_is_refused_with_the_remedy():
    _, plain = optimization("constant", 0)
    with pytest.raises(FloatingPointError, match="non-finite training loss .* lower optim.learning_rate"):
        plain.backward(torch.tensor(float("nan"), requires_grad=True))
