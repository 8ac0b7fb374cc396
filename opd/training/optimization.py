"""AdamW with a warmup + constant / linear / cosine schedule, a grad scaler for float16, and the clipped step.
Master weights and optimizer state are fp32; with float16 an overflowing step is skipped by the scaler."""

from __future__ import annotations

import math

import torch
from transformers import get_scheduler

from common.minimind.precision import Precision
from opd.config import OptimConfig

SCHEDULERS = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


class Optimization:
    """The optimizer, learning-rate schedule and grad scaler of one trained model."""

    def __init__(self, model: torch.nn.Module, settings: OptimConfig, schedule_steps: int, precision: Precision):
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        self.grad_clip = settings.grad_clip
        self.precision = precision
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate,
                                           weight_decay=settings.weight_decay)
        self.scheduler = get_scheduler(SCHEDULERS[settings.lr_scheduler], self.optimizer,
                                       num_warmup_steps=settings.warmup_steps, num_training_steps=schedule_steps)
        self.scaler = precision.grad_scaler()

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def backward(self, loss: torch.Tensor) -> None:
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite training loss ({loss.item()}); lower optim.learning_rate "
                                     "or check the checkpoints")
        self.scaler.scale(loss).backward()

    def step(self) -> float:
        """Clip, step and clear the accumulated gradients; returns the gradient norm before clipping."""
        self.scaler.unscale_(self.optimizer)
        max_norm = self.grad_clip if self.grad_clip else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, max_norm,
                                                   error_if_nonfinite=not self.precision.uses_grad_scaler)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(grad_norm)

    def skip(self) -> float:
        """A step without an update (no target left in the window): the schedule moves on; returns 0. With no gradient
        accumulated, AdamW's step changes no weight and no moment (weight decay included)."""
        self.optimizer.step()
        self.scheduler.step()
        return 0.0

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
