"""Device and precision choice: ``auto`` is CUDA with bfloat16 autocast when available, else CPU in float32.

Master weights and optimizer state stay float32; ``bfloat16``/``float16`` run forwards under autocast
(float16 with a gradient scaler, CUDA only).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from common.user_errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Precision:
    """Where the models run and which autocast dtype forwards use (float32: none)."""

    device: torch.device
    dtype: torch.dtype

    @property
    def dtype_name(self) -> str:
        return next(name for name, dtype in DTYPES.items() if dtype == self.dtype)

    @property
    def uses_grad_scaler(self) -> bool:
        return self.dtype == torch.float16

    def autocast(self) -> AbstractContextManager:
        if self.dtype == torch.float32:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device.type, enabled=self.uses_grad_scaler)


def resolve_precision(device: str = "auto", dtype: str = "auto") -> Precision:
    """``device``: auto, cpu, cuda, cuda:N; ``dtype``: auto, float32, bfloat16, float16."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise UserError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device={device}, but CUDA is not available (use device=cpu or device=auto)")
    if dtype == "auto":
        dtype = "bfloat16" if resolved.type == "cuda" else "float32"
    if dtype not in DTYPES:
        raise UserError(f"dtype must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "float16" and resolved.type != "cuda":
        raise UserError("dtype=float16 needs CUDA (it trains with a gradient scaler); use float32 or bfloat16")
    return Precision(resolved, DTYPES[dtype])
