"""The models a training entry starts from, loaded and checked before any compute: sft's model and train's student
and teacher (one tokenizer, one vocabulary, ``rollout.max_total_len`` within both models' positions)."""

from __future__ import annotations

import torch

from common.minimind.model import build_model, check_tokenizer_fits, load_model
from common.minimind.tokenizer import check_same_tokenizer, load_tokenizer
from common.user_errors import UserError
from opd.config import OPDConfig, SFTConfig


def initial_model(cfg: SFTConfig):
    """The model to fine-tune and its tokenizer (a seeded random init when ``from_scratch``)."""
    if not cfg.from_scratch:
        return load_model(cfg.model, role="model")
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model.arch)
    tokenizer = load_tokenizer(cfg.model.tokenizer, role="model.tokenizer")
    check_tokenizer_fits(tokenizer, model, role="model", exact=True)
    return model, tokenizer


def load_student_and_teacher(cfg: OPDConfig):
    """Both models and the shared tokenizer, checked to agree and fit ``max_total_len``; with a served teacher only the
    student loads (teacher None)."""
    student, tokenizer = load_model(cfg.student, role="student")
    teacher = None
    if cfg.local_teacher:
        teacher, teacher_tokenizer = load_model(cfg.teacher, role="teacher")
        check_same_tokenizer(teacher_tokenizer, tokenizer)
        sizes = [model.get_output_embeddings().weight.shape[0] for model in (teacher, student)]
        if sizes[0] != sizes[1]:
            raise UserError(f"teacher and student vocabulary sizes differ: {sizes[0]} vs {sizes[1]}")
        if cfg.guidance.top_k is not None and cfg.guidance.top_k > sizes[0]:
            raise UserError(f"guidance.top_k={cfg.guidance.top_k} exceeds the vocabulary ({sizes[0]} tokens)")
    for role, model in (("teacher", teacher), ("student", student)):
        if model is None:
            continue
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit is not None and cfg.rollout.max_total_len > limit:
            raise UserError(f"rollout.max_total_len={cfg.rollout.max_total_len} exceeds the {role}'s {limit} positions")
    return student, teacher, tokenizer
