"""Token-level distillation divergence over the full vocabulary (GKD-style, fp32 softmax).

``forward_kl``: T²·KL(teacher_T ‖ student_T); ``reverse_kl``: T²·KL(student_T ‖ teacher_T), both at the same
(student-sampled) prefixes, where ``p_T = softmax(logits / T)``. The teacher side is detached: gradients flow
only into the student logits (the sampled tokens themselves are data, a semi-gradient).
"""

from __future__ import annotations

import torch

KL_DIRECTIONS = ("forward_kl", "reverse_kl")


def token_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, *, temperature: float = 1.0,
             direction: str = "forward_kl") -> torch.Tensor:
    """Per-position T²-scaled KL for ``[..., vocab]`` logits; returns ``[...]`` in fp32."""
    if direction not in KL_DIRECTIONS:
        raise ValueError(f"kl_direction must be one of {KL_DIRECTIONS}, got {direction!r}")
    if not temperature > 0:
        raise ValueError(f"distill_temperature must be > 0, got {temperature}")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ in shape (vocabularies must match)")
    student = torch.log_softmax(student_logits.float() / temperature, dim=-1)
    teacher = torch.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    if direction == "forward_kl":
        kl = (teacher.exp() * (teacher - student)).sum(dim=-1)
    else:
        kl = (student.exp() * (student - teacher)).sum(dim=-1)
    return kl * temperature**2

