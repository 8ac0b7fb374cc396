"""Device and precision: ``auto`` is CUDA with bfloat16 autocast, else CPU in float32. Weights and optimizer state
stay float32; float16 (CUDA only) adds a gradient scaler. :func:`check_precision_names` is torch-free."""

from __future__ import annotations

import re
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.user_errors import UserError

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16")
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


@dataclass(frozen=True)
class Precision:
    """Where the models run and which autocast dtype forwards use (float32: none)."""

    device: torch.device
    dtype_name: str

    @property
    def dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype_name)

    @property
    def uses_grad_scaler(self) -> bool:
        return self.dtype_name == "float16"

    def autocast(self) -> AbstractContextManager:
        if self.dtype_name == "float32":
            return nullcontext()
        import torch

        return torch.autocast(self.device.type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        import torch

        return torch.amp.GradScaler(self.device.type, enabled=self.uses_grad_scaler)


def check_precision_names(device: str = "auto", dtype: str = "auto") -> None:
    """``device``: auto, cpu, cuda, cuda:N; ``dtype``: auto, float32, bfloat16, float16 (float16 not on the CPU)."""
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise UserError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")
    if dtype != "auto" and dtype not in DTYPE_NAMES:
        raise UserError(f"dtype must be auto or one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
    if dtype == "float16" and device == "cpu":
        raise UserError("dtype=float16 needs CUDA (it trains with a gradient scaler); use float32 or bfloat16")


def resolve_precision(device: str = "auto", dtype: str = "auto") -> Precision:
    """The checked settings, with ``auto`` and CUDA's availability answered by torch."""
    import torch

    check_precision_names(device, dtype)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device={device}, but CUDA is not available (use device=cpu or device=auto)")
    if dtype == "auto":
        dtype = "bfloat16" if resolved.type == "cuda" else "float32"
    if dtype == "float16" and resolved.type != "cuda":
        raise UserError("dtype=float16 needs CUDA (it trains with a gradient scaler); use float32 or bfloat16")
    return Precision(resolved, dtype)
