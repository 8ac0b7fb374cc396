"""Distillation loss and updates: hand-checked KL values, gradient masking, frozen teacher, MoE aux loss, convergence."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from opd.chat_format import ChatFormat
from opd.distill_loss import token_kl
from opd.distill_step import (
    DistillSettings,
    distill_update,
    forward_targets,
    freeze,
    router_aux_coef,
    teacher_target_logits,
)
from opd.episodes import pack_episodes
from opd.minimind.model import MiniMindArch
from opd.minimind.precision import resolve_precision
from opd.rollout import AgentRollout, RolloutLimits
from opd.sampling import ScriptedSampler
from opd.shared_prefix import MIN_SHARED_PREFIX, shared_prefix_length
from tests.opd_support import TINY_TEACHER, agent_record, call_text, encode, tiny_model

CPU = resolve_precision("cpu", "float32")


def kl_by_hand(p_logits, q_logits, temperature):
    """sum_v p(v) * log(p(v) / q(v)) * T^2 with p, q = softmax(logits / T), in plain Python."""
    def softmax(logits):
        exps = [math.exp(x / temperature) for x in logits]
        return [e / sum(exps) for e in exps]
    p, q = softmax(p_logits), softmax(q_logits)
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True)) * temperature**2


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_kl_values_both_directions_against_hand_calculation(temperature):
    student = [[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
    teacher = [[1.5, 0.2, -0.3, 0.7], [3.0, -2.0, 0.0, 0.5]]
    s, t = torch.tensor(student), torch.tensor(teacher)
    forward = token_kl(s, t, temperature=temperature, direction="forward_kl")
    reverse = token_kl(s, t, temperature=temperature, direction="reverse_kl")
    assert forward.tolist() == pytest.approx([kl_by_hand(t_, s_, temperature) for s_, t_ in zip(student, teacher, strict=True)],
                                             rel=1e-5)
    assert reverse.tolist() == pytest.approx([kl_by_hand(s_, t_, temperature) for s_, t_ in zip(student, teacher, strict=True)],
                                             rel=1e-5)
    assert forward[0].item() != pytest.approx(reverse[0].item(), rel=1e-3)
    assert token_kl(s, s.clone(), temperature=temperature).abs().max() < 1e-6
    with pytest.raises(ValueError, match="kl_direction"):
        token_kl(s, t, direction="js")


@pytest.fixture(scope="module")
def episodes(tokenizer):
    """Two scripted two-turn episodes of different lengths (prompt, call turn, observation, answer turn, padding)."""
    eos = [tokenizer.eos_token_id]
    records = [agent_record("loss.jsonl:1", "What is 6*7?", names_only=True),
               agent_record("loss.jsonl:2", "And 2+2, please?", names_only=True)]
    scripts = {
        "loss.jsonl:1": [encode(tokenizer, call_text("calculate_math", expression="6*7")) + eos,
                         encode(tokenizer, "It is 42.") + eos],
        "loss.jsonl:2": [encode(tokenizer, "Sure. " + call_text("calculate_math", expression="2+2")) + eos,
                         encode(tokenizer, "The answer is 4, as computed.") + eos],
    }
    rollout = AgentRollout(tiny_model(seed=5), ChatFormat(tokenizer), ScriptedSampler(scripts),
                           RolloutLimits(2, 64, 4096))
    result = rollout.run(records)
    assert [len(e.turns) for e in result] == [2, 2] and all(e.stop_reason == "answer" for e in result)
    assert shared_prefix_length(result) >= MIN_SHARED_PREFIX  # the batched forwards below share the prompt prefix
    return result


def update(student, teacher, micro_batches, tokenizer, *, lr=1e-3, optimizer=None, settings=None):
    settings = settings or DistillSettings()
    optimizer = optimizer or torch.optim.AdamW(student.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return distill_update(micro_batches, student=student, teacher=teacher, optimizer=optimizer, scheduler=scheduler,
                          scaler=CPU.grad_scaler(), settings=settings, precision=CPU,
                          pad_token_id=tokenizer.pad_token_id)


def test_gradient_reaches_only_target_positions(tokenizer, episodes):
    student, teacher = tiny_model(seed=1), freeze(tiny_model(TINY_TEACHER, seed=2))
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    logits = student(input_ids=packed.input_ids, attention_mask=packed.attention_mask).logits
    logits.retain_grad()
    teacher_logits = teacher_target_logits(teacher, packed, CPU)
    token_kl(logits[:, :-1][packed.target_mask], teacher_logits, temperature=2.0).sum().backward()
    has_grad = logits.grad.abs().sum(-1) > 0
    expected = torch.zeros_like(has_grad)
    expected[:, :-1] = packed.target_mask  # logits at t predict token t + 1
    assert torch.equal(has_grad, expected)
    assert not has_grad[packed.attention_mask == 0].any() and not has_grad[:, -1].any()
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())


def test_shared_prefix_forward_gives_the_full_forward_logits_and_gradients(tokenizer, episodes):
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    prefix = shared_prefix_length(episodes)
    assert 0 < prefix < min(e.prompt_length for e in episodes)
    results = []
    for shared in (0, prefix):
        student = tiny_model(seed=1).train()
        logits, _ = forward_targets(student, packed, shared)
        logits.float().log_softmax(-1)[:, :50].sum().backward()
        results.append((logits.detach(), [p.grad.clone() for p in student.parameters()]))
    (full, full_grads), (split, split_grads) = results
    assert full.shape == split.shape == (packed.target_count, 6400)
    torch.testing.assert_close(split, full, atol=1e-4, rtol=1e-4)
    for a, b in zip(split_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-3)


def test_update_changes_only_the_student_and_matches_hand_loss(tokenizer, episodes):
    student, teacher = tiny_model(seed=1), freeze(tiny_model(TINY_TEACHER, seed=2))
    before_student = copy.deepcopy(student.state_dict())
    before_teacher = copy.deepcopy(teacher.state_dict())
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    with torch.no_grad():
        s = student(input_ids=packed.input_ids, attention_mask=packed.attention_mask).logits[:, :-1][packed.target_mask]
        t = teacher(input_ids=packed.input_ids, attention_mask=packed.attention_mask).logits[:, :-1][packed.target_mask]
    expected = token_kl(s, t, direction="reverse_kl").mean().item()
    stats = update(student, teacher, [episodes], tokenizer, settings=DistillSettings(direction="reverse_kl"))
    assert stats.loss == pytest.approx(expected, rel=1e-5) and stats.aux_loss == 0.0
    assert stats.target_tokens == sum(e.assistant_tokens for e in episodes) == packed.target_count
    assert all(not torch.equal(before_student[k], v) for k, v in student.state_dict().items() if "norm" not in k)
    assert all(torch.equal(before_teacher[k], v) for k, v in teacher.state_dict().items())
    assert all(p.grad is None for p in student.parameters())  # zeroed after the step


def test_loss_is_zero_when_student_equals_teacher(tokenizer, episodes):
    student = tiny_model(seed=3)
    teacher = freeze(copy.deepcopy(student))
    stats = update(student, teacher, [episodes], tokenizer)
    assert abs(stats.loss) < 1e-6 and stats.grad_norm < 1e-5


def test_accumulation_weights_micro_batches_by_target_tokens(tokenizer, episodes):
    teacher = freeze(tiny_model(TINY_TEACHER, seed=2))
    deltas = []
    for micro_batches in ([episodes], [episodes[:1], episodes[1:]]):
        student = tiny_model(seed=1)
        start = [p.detach().clone() for p in student.parameters()]
        update(student, teacher, micro_batches, tokenizer, optimizer=torch.optim.SGD(student.parameters(), lr=1.0),
               settings=DistillSettings(grad_clip=None))
        deltas.append([p.detach() - s for p, s in zip(student.parameters(), start, strict=True)])
    for whole, split in zip(*deltas, strict=True):
        torch.testing.assert_close(whole, split, atol=1e-6, rtol=1e-4)


def test_moe_student_adds_router_aux_loss(tokenizer, episodes):
    moe = MiniMindArch(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, use_moe=True)
    student, teacher = tiny_model(moe, seed=4), freeze(tiny_model(TINY_TEACHER, seed=2))
    coef = router_aux_coef(student)
    assert coef == student.config.router_aux_loss_coef and router_aux_coef(teacher) is None
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    with torch.no_grad():
        out = student(input_ids=packed.input_ids, attention_mask=packed.attention_mask, output_router_logits=True)
        t = teacher(input_ids=packed.input_ids, attention_mask=packed.attention_mask).logits[:, :-1][packed.target_mask]
    kl = token_kl(out.logits[:, :-1][packed.target_mask], t).mean().item()
    stats = update(student, teacher, [episodes], tokenizer)
    assert stats.aux_loss == pytest.approx(coef * out.aux_loss.item(), rel=1e-5) and stats.aux_loss > 0
    assert stats.kl == pytest.approx(kl, rel=1e-5) and stats.loss == pytest.approx(kl + stats.aux_loss, rel=1e-6)


def test_two_turn_optimization_halves_teacher_divergence_on_every_turn(tokenizer, episodes):
    student, teacher = tiny_model(seed=1), freeze(tiny_model(TINY_TEACHER, seed=2))
    teacher.model.norm.weight.mul_(30.0)  # a confident teacher: sharp next-token distributions, large initial KL
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    turn_of_target = torch.zeros_like(packed.target_mask, dtype=torch.long)
    for row, episode in enumerate(episodes):
        for index, turn in enumerate(episode.turns):
            turn_of_target[row, turn.start - 1:turn.end - 1] = index

    def per_turn_kl():
        with torch.no_grad():
            s = student(input_ids=packed.input_ids, attention_mask=packed.attention_mask).logits[:, :-1]
        kl = token_kl(s[packed.target_mask], teacher_target_logits(teacher, packed, CPU))
        turns = turn_of_target[packed.target_mask]
        return [kl[turns == index].mean().item() for index in (0, 1)]

    before = per_turn_kl()
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-2, weight_decay=0.0)
    losses = [update(student, teacher, [episodes], tokenizer, optimizer=optimizer).loss for _ in range(15)]
    after = per_turn_kl()
    assert all(a < 0.5 * b for a, b in zip(after, before, strict=True)), (before, after)
    assert losses[-1] < 0.5 * losses[0]
