"""The served teacher's losses: top-k forward KL with a tail bucket, and the sampled-token reverse KL estimator,
against hand calculations and the full-vocabulary losses they stand for."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from common.minimind.precision import resolve_precision
from opd.config import LossConfig
from opd.episodes.episode import TopLogprobs, pack_episodes
from opd.training.loss import (
    TargetLogits,
    distill_loss_step,
    logits_at_targets,
    sampled_token_reverse_kl,
    token_divergence,
    topk_forward_kl,
)
from tests.helpers.opd_support import TINY_STUDENT, TINY_TEACHER, tiny_model
from tests.opd.test_loss import episodes, frozen  # noqa: F401  (episodes: a fixture)

FORWARD, REVERSE = LossConfig("forward_kl", 1.0, 0.5), LossConfig("reverse_kl", 1.0, 0.5)
CPU = resolve_precision("cpu", "float32")


def random_logits(rows: int, vocab: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=generator, dtype=torch.float64).float() * scale


def test_topk_forward_kl_by_hand_with_its_tail_bucket():
    """Vocabulary of 4, teacher top-2 = ids 0 and 2: KL over {0, 2, tail} with the tail holding ids 1 and 3."""
    teacher, student = torch.tensor([0.5, 0.1, 0.3, 0.1]), torch.tensor([0.2, 0.4, 0.3, 0.1])
    top = TopLogprobs(torch.tensor([[0, 2]]), teacher[[0, 2]].log()[None], teacher[[1]].log())
    kl, mass = topk_forward_kl(student.log()[None], top)
    by_hand = 0.5 * math.log(0.5 / 0.2) + 0.3 * math.log(0.3 / 0.3) + 0.2 * math.log(0.2 / 0.5)
    torch.testing.assert_close(kl, torch.tensor([by_hand]), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(mass, torch.tensor([0.8]))


def test_with_k_equal_to_the_vocabulary_it_is_the_full_vocabulary_forward_kl_and_gradient():
    teacher, student = random_logits(7, 6400, seed=1), random_logits(7, 6400, seed=2).requires_grad_()
    next_ids = torch.arange(7) * 900
    kl, mass = topk_forward_kl(student, TopLogprobs.of_logits(teacher, next_ids, 6400))
    full = token_divergence(student, teacher, FORWARD)
    torch.testing.assert_close(kl, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mass, torch.ones(7), atol=1e-5, rtol=0)
    topk_gradient, = torch.autograd.grad(kl.sum(), student)
    full_gradient, = torch.autograd.grad(full.sum(), student)
    assert torch.isfinite(topk_gradient).all()
    torch.testing.assert_close(topk_gradient, full_gradient, atol=1e-6, rtol=1e-4)


def test_a_coarser_top_k_never_exceeds_the_full_kl_and_grows_with_k():
    """Merging ids into the tail bucket can only lose divergence (the data-processing inequality)."""
    teacher, student = random_logits(32, 6400, seed=3), random_logits(32, 6400, seed=4)
    next_ids = torch.randint(0, 6400, (32,), generator=torch.Generator().manual_seed(5))
    full = token_divergence(student, teacher, FORWARD)
    values = [topk_forward_kl(student, TopLogprobs.of_logits(teacher, next_ids, k))[0] for k in (1, 20, 64, 6400)]
    for coarse, fine in zip(values, values[1:], strict=False):
        assert (coarse <= fine + 1e-5).all()
    assert (values[-2] <= full + 1e-5).all() and torch.allclose(values[-1], full, atol=1e-5, rtol=1e-5)


def test_the_served_rows_next_token_outside_the_top_k_is_an_extra_slot_not_a_double_count():
    teacher = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    inside, outside = (TopLogprobs.of_logits(teacher, torch.tensor([i]), 2) for i in (1, 4))
    assert inside.ids.tolist() == [[0, 1, -1]] and outside.ids.tolist() == [[0, 1, 4]]
    logprobs = torch.log_softmax(teacher, -1)[0]
    assert outside.next_token.item() == pytest.approx(logprobs[4].item())
    student = torch.zeros(1, 5)
    kl = topk_forward_kl(student, outside)[0]
    rest = 1 - logprobs[[0, 1, 4]].exp().sum()
    by_hand = sum(p * (p.log() - math.log(0.2)) for p in logprobs[[0, 1, 4]].exp()) + rest * (rest / 0.4).log()
    torch.testing.assert_close(kl, by_hand[None], atol=1e-6, rtol=1e-6)


def test_sampled_token_reverse_kl_value_is_the_log_ratio_of_the_sampled_token():
    student, teacher = random_logits(5, 50, seed=6), random_logits(5, 50, seed=7)
    labels = torch.tensor([0, 10, 20, 30, 49])
    value = sampled_token_reverse_kl(student, labels, TopLogprobs.of_logits(teacher, labels, 5).next_token)
    expected = (torch.log_softmax(student, -1) - torch.log_softmax(teacher, -1)).gather(-1, labels[:, None])[:, 0]
    torch.testing.assert_close(value, expected)


def test_sampled_token_reverse_kl_gradient_is_the_full_reverse_kl_gradient_in_expectation_exactly():
    """Σ_y p_s(y) · ∇ estimate(y), enumerated over the vocabulary, equals ∇ KL(student ‖ teacher) (w.r.t. logits)."""
    vocab = 40
    student, teacher = random_logits(3, vocab, seed=8).requires_grad_(), random_logits(3, vocab, seed=9)
    full, = torch.autograd.grad(token_divergence(student, teacher, REVERSE).sum(), student)
    teacher_logprobs = torch.log_softmax(teacher, -1)
    expected = torch.zeros_like(student)
    p_student = torch.softmax(student.detach(), -1)
    for y in range(vocab):
        labels = torch.full((3,), y)
        estimate = sampled_token_reverse_kl(student, labels, teacher_logprobs[:, y])
        weighted, = torch.autograd.grad((estimate * p_student[:, y]).sum(), student)
        expected += weighted
    torch.testing.assert_close(expected, full, atol=1e-6, rtol=1e-4)


def test_sampled_token_reverse_kl_gradient_on_a_tiny_models_weights_matches_in_expectation(tokenizer):
    """A seeded Monte Carlo over 20,000 samples of one position's next token from a tiny student (MiniMind's
    architecture, a vocabulary of 64 so that the samples cover it): the mean estimator gradient on every weight
    points where the full reverse KL's does (cosine > 0.99, norm within 5 %)."""
    student = tiny_model(replace(TINY_STUDENT, vocab_size=64), seed=1)
    teacher = frozen(tiny_model(replace(TINY_TEACHER, vocab_size=64), seed=2))
    ids = torch.tensor([[1, 2, 3, 30, 31, 32, 10, 11]])
    logits = student(ids).logits[0, -1:].float()
    with torch.no_grad():
        teacher_logprobs = torch.log_softmax(teacher(ids).logits[0, -1].float(), -1)
    parameters = [p for p in student.parameters() if p.requires_grad]
    full = torch.autograd.grad(token_divergence(logits, teacher(ids).logits[0, -1:].detach(), REVERSE).sum(),
                               parameters, retain_graph=True)
    samples = torch.multinomial(torch.softmax(logits.detach(), -1)[0], 20_000, replacement=True,
                                generator=torch.Generator().manual_seed(0))
    rows = logits.expand(len(samples), -1)
    estimate = sampled_token_reverse_kl(rows, samples, teacher_logprobs[samples]).mean()
    sampled = torch.autograd.grad(estimate, parameters)
    full_flat = torch.cat([g.flatten() for g in full])
    sampled_flat = torch.cat([g.flatten() for g in sampled])
    assert torch.nn.functional.cosine_similarity(full_flat, sampled_flat, dim=0) > 0.99
    assert sampled_flat.norm() / full_flat.norm() == pytest.approx(1.0, abs=0.05)


def test_distill_loss_step_on_served_scores_at_full_width_equals_the_local_teachers(tokenizer, episodes):  # noqa: F811
    """The loss step fed a served teacher's scores (here the local teacher's, as vLLM would return them at k = 6400)
    gives the local teacher's forward KL; reverse KL gives the sampled-token estimate of the rollout's own tokens."""
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    student, teacher = tiny_model(seed=1), frozen(tiny_model(TINY_TEACHER, seed=2))
    with torch.no_grad():
        teacher_logits, _ = logits_at_targets(teacher, packed)
        student_logits, _ = logits_at_targets(student, packed)
    labels = packed.input_ids[:, 1:][packed.target_mask]
    counts = [int(packed.target_mask[row].sum()) for row in range(len(episodes))]
    served = [replace(episode, teacher_top=TopLogprobs.of_logits(part, part_labels, 6400))
              for episode, part, part_labels in zip(episodes, teacher_logits.split(counts), labels.split(counts),
                                                    strict=True)]
    with torch.no_grad():
        local, _ = distill_loss_step(TargetLogits(student), teacher, episodes, packed, FORWARD, CPU)
        topk, _ = distill_loss_step(TargetLogits(student), None, served, packed, FORWARD, CPU)
        sampled, _ = distill_loss_step(TargetLogits(student), None, served, packed, REVERSE, CPU)
    torch.testing.assert_close(topk, local, atol=1e-4, rtol=1e-5)
    log_ratio = (torch.log_softmax(student_logits, -1) - torch.log_softmax(teacher_logits, -1)).gather(
        -1, labels[:, None]).sum()
    torch.testing.assert_close(sampled, log_ratio, atol=1e-4, rtol=1e-5)
