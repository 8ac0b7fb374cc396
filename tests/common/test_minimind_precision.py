"""Device and precision choice: the auto rules, bfloat16 autocast, and refusals that name the setting."""

from __future__ import annotations

import pytest
import torch

from common.minimind.precision import resolve_precision


def test_auto_on_a_machine_without_cuda_is_cpu_float32_without_autocast(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    precision = resolve_precision("auto", "auto")
    assert precision.device == torch.device("cpu") and precision.dtype == torch.float32
    assert precision.dtype_name == "float32" and not precision.uses_grad_scaler
    with precision.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    assert not precision.grad_scaler().is_enabled()


def test_auto_with_cuda_is_bfloat16_without_a_scaler(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    precision = resolve_precision("auto", "auto")
    assert precision.device == torch.device("cuda") and precision.dtype == torch.bfloat16
    assert precision.dtype_name == "bfloat16" and not precision.uses_grad_scaler
    assert resolve_precision("cuda:1", "float16").uses_grad_scaler


def test_bfloat16_autocast_runs_matmuls_in_bfloat16_on_cpu():
    precision = resolve_precision("cpu", "bfloat16")
    with precision.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


@pytest.mark.parametrize("device,dtype,message", [
    ("cuda", "auto", "device=cuda, but CUDA is not available"),
    ("cpu", "float16", "dtype=float16 needs CUDA"),
    ("cpu", "fp8", "dtype must be auto or one of float32, bfloat16, float16, got 'fp8'"),
])
def test_impossible_settings_are_refused_by_name(monkeypatch, device, dtype, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=message):
        resolve_precision(device, dtype)
