"""Distillation loss and updates: hand-checked KL values, gradient masking, frozen teacher, MoE aux loss, convergence."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from common.minimind.precision import resolve_precision
from common.minimind.spec import MiniMindArch
from opd.config import LossConfig, RolloutConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.episode import MIN_SHARED_PREFIX, pack_episodes, shared_prefix_length
from opd.rollouts.rollout import AgentRollout
from opd.training.loss import (
    TargetLogits,
    distill_loss_step,
    logits_at_targets,
    router_aux_coef,
    router_loss,
    sft_loss_step,
    target_cross_entropy,
    token_divergence,
)
from standins.scripted_sampler import ScriptedSampler
from tests.helpers.opd_support import TINY_TEACHER, agent_record, call_text, encode, tiny_model

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
    forward = token_divergence(s, t, LossConfig("forward_kl", temperature, 0.5))
    reverse = token_divergence(s, t, LossConfig("reverse_kl", temperature, 0.5))
    assert forward.tolist() == pytest.approx([kl_by_hand(t_, s_, temperature) for s_, t_ in zip(student, teacher, strict=True)],
                                             rel=1e-5)
    assert reverse.tolist() == pytest.approx([kl_by_hand(s_, t_, temperature) for s_, t_ in zip(student, teacher, strict=True)],
                                             rel=1e-5)
    assert forward[0].item() != pytest.approx(reverse[0].item(), rel=1e-3)
    assert token_divergence(s, s.clone(), LossConfig("forward_kl", temperature, 0.5)).abs().max() < 1e-6
    with pytest.raises(ValueError, match="loss.kl_direction must be one of forward_kl, reverse_kl, jsd"):
        LossConfig("js", 1.0, 0.5)


def jsd_by_hand(teacher_logits, student_logits, beta: float, temperature: float) -> float:
    """GKD's JSD(β) in float64 from its definition: β·KL(T ‖ M) + (1-β)·KL(S ‖ M), M = β·T + (1-β)·S, times T²."""
    def softmax(logits):
        exps = [math.exp(x / temperature) for x in logits]
        return [e / sum(exps) for e in exps]
    t, s = softmax(teacher_logits), softmax(student_logits)
    m = [beta * ti + (1 - beta) * si for ti, si in zip(t, s, strict=True)]
    kl = lambda p, q: sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))  # noqa: E731
    return (beta * kl(t, m) + (1 - beta) * kl(s, m)) * temperature**2


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_jsd_against_a_float64_hand_calculation(beta, temperature):
    student = [[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0], [8.0, -8.0, 0.0, 0.1]]
    teacher = [[1.5, 0.2, -0.3, 0.7], [3.0, -2.0, 0.0, 0.5], [-8.0, 8.0, 0.0, 0.1]]
    settings = LossConfig("jsd", temperature, beta)
    expected = [jsd_by_hand(t, s, beta, temperature) for s, t in zip(student, teacher, strict=True)]
    in_fp64 = token_divergence(torch.tensor(student, dtype=torch.float64), torch.tensor(teacher, dtype=torch.float64),
                               settings)
    assert in_fp64.dtype == torch.float64 and in_fp64.tolist() == pytest.approx(expected, rel=1e-12)
    in_fp32 = token_divergence(torch.tensor(student), torch.tensor(teacher), settings)
    assert in_fp32.dtype == torch.float32 and in_fp32.tolist() == pytest.approx(expected, rel=1e-5)
    assert 0 < max(expected) <= math.log(2) * temperature**2 + 1e-12  # a JSD is bounded by log 2
    symmetric = token_divergence(torch.tensor(teacher, dtype=torch.float64), torch.tensor(student, dtype=torch.float64),
                                 LossConfig("jsd", temperature, 1 - beta))
    torch.testing.assert_close(symmetric, in_fp64)  # swapping the models is swapping β and 1 - β


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_jsd_limits_are_the_forward_and_reverse_kl(temperature):
    """JSD(β)/β → KL(teacher ‖ student) as β → 0 and JSD(β)/(1-β) → KL(student ‖ teacher) as β → 1, with an error of
    order β·E[teacher/student] (resp. (1-β)·E[student/teacher]): tens here, so at 1e-9 it is below 1e-6 relative,
    and ten times β gives about ten times the error."""
    generator = torch.Generator().manual_seed(0)
    student = torch.randn(5, 64, generator=generator, dtype=torch.float64) * 2
    teacher = torch.randn(5, 64, generator=generator, dtype=torch.float64) * 2
    forward = token_divergence(student, teacher, LossConfig("forward_kl", temperature, 0.5))
    reverse = token_divergence(student, teacher, LossConfig("reverse_kl", temperature, 0.5))

    def ends(beta: float):
        return (token_divergence(student, teacher, LossConfig("jsd", temperature, beta)) / beta,
                token_divergence(student, teacher, LossConfig("jsd", temperature, 1 - beta)) / beta)

    near_zero, near_one = ends(1e-9)
    torch.testing.assert_close(near_zero, forward, rtol=1e-6, atol=0)
    torch.testing.assert_close(near_one, reverse, rtol=1e-6, atol=0)
    errors = [((a - forward).abs().max().item(), (b - reverse).abs().max().item()) for a, b in (ends(1e-5), ends(1e-4))]
    assert 5 < errors[1][0] / errors[0][0] < 20 and 5 < errors[1][1] / errors[0][1] < 20  # first order in β
    halfway = token_divergence(student, teacher, LossConfig("jsd", temperature, 0.5))
    assert (halfway < torch.minimum(forward, reverse)).all()  # JSD(0.5) <= log 2 < the KLs of these far-apart rows


def test_jsd_gradient_is_the_finite_difference_of_its_value():
    student = torch.tensor([[0.3, -0.7, 1.1, 0.0]], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([[1.0, 0.5, -1.0, 0.2]], dtype=torch.float64)
    torch.autograd.gradcheck(lambda s: token_divergence(s, teacher, LossConfig("jsd", 1.5, 0.3)), (student,))


@pytest.mark.parametrize("beta", [0.0, 1.0, -0.1, 1.5])
def test_jsd_beta_outside_the_open_interval_is_refused(beta):
    with pytest.raises(ValueError, match=r"loss.jsd_beta must be in \(0, 1\)"):
        LossConfig("jsd", 1.0, beta)


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
                           RolloutConfig(2, 64, 4096, open_thinking=False))
    result = rollout.run(records)
    assert [len(e.turns) for e in result] == [2, 2] and all(e.stop_reason == "answer" for e in result)
    assert shared_prefix_length(result) >= MIN_SHARED_PREFIX  # the batched forwards below share the prompt prefix
    return result


FORWARD = LossConfig("forward_kl", 1.0, 0.5)


def frozen(model):
    return model.eval().requires_grad_(False)


def full_forward_targets(model, packed):
    """Logits at the targets from a plain full forward (the reference the target-only path must match)."""
    return model(input_ids=packed.input_ids, attention_mask=packed.attention_mask).logits[:, :-1][packed.target_mask]


def test_logits_at_targets_equal_the_full_forward_and_reach_only_target_positions(tokenizer, episodes):
    student = tiny_model(seed=1)
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    logits, _ = logits_at_targets(student, packed)
    assert logits.dtype == torch.float32 and logits.shape == (packed.target_count, 6400)
    torch.testing.assert_close(logits, full_forward_targets(student, packed), atol=1e-5, rtol=1e-5)
    full = student(input_ids=packed.input_ids, attention_mask=packed.attention_mask).logits
    full.retain_grad()
    teacher = frozen(tiny_model(TINY_TEACHER, seed=2))
    with torch.no_grad():
        teacher_logits, _ = logits_at_targets(teacher, packed)
    token_divergence(full[:, :-1][packed.target_mask], teacher_logits, LossConfig("forward_kl", 2.0, 0.5)).sum().backward()
    has_grad = full.grad.abs().sum(-1) > 0
    expected = torch.zeros_like(has_grad)
    expected[:, :-1] = packed.target_mask  # logits at t predict token t + 1
    assert torch.equal(has_grad, expected)
    assert not has_grad[packed.attention_mask == 0].any() and not has_grad[:, -1].any()


def test_only_each_rows_own_targets_reach_the_vocabulary_projection(tokenizer, episodes):
    """Rows train at different positions: the projection sees each row's targets, not every position where some row
    trains; a shared prefix that would reach a target is refused."""
    student = tiny_model(seed=1)
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    some_row_trains = packed.target_mask.any(dim=0)
    assert packed.target_count < int(some_row_trains.sum()) * len(episodes)
    projected = []
    student.lm_head.register_forward_hook(lambda module, inputs, output: projected.append(inputs[0].shape[0]))
    with torch.no_grad():
        logits_at_targets(student, packed)
    assert projected == [packed.target_count]
    first_target = int(some_row_trains.nonzero()[0])
    with pytest.raises(ValueError, match=f"a shared prefix of {first_target + 1} ids reaches a target"):
        logits_at_targets(student, packed, first_target + 1)


def test_shared_prefix_forward_gives_the_full_forward_logits_and_gradients(tokenizer, episodes):
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    prefix = shared_prefix_length(episodes)
    assert 0 < prefix < min(e.prompt_length for e in episodes)
    results = []
    for shared in (0, prefix):
        student = tiny_model(seed=1).train()
        logits, _ = logits_at_targets(student, packed, shared)
        logits.log_softmax(-1)[:, :50].sum().backward()
        results.append((logits.detach(), [p.grad.clone() for p in student.parameters()]))
    (full, full_grads), (split, split_grads) = results
    assert full.shape == split.shape == (packed.target_count, 6400)
    torch.testing.assert_close(split, full, atol=1e-4, rtol=1e-4)
    for a, b in zip(split_grads, full_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-3)


def test_the_recipes_loss_steps_are_their_losses_at_the_targets(tokenizer, episodes):
    """``distill_loss_step`` with the teacher run on the batch or its logits kept from a guided rollout, and
    ``sft_loss_step``, equal their divergence / cross-entropy of ``logits_at_targets``; a dense model has no router
    loss."""
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    student, teacher = tiny_model(seed=1), frozen(tiny_model(TINY_TEACHER, seed=2))
    with torch.no_grad():
        student_logits, _ = logits_at_targets(student, packed)
        teacher_logits, _ = logits_at_targets(teacher, packed)
        expected = token_divergence(student_logits, teacher_logits, FORWARD).sum()
        run, router = distill_loss_step(TargetLogits(student), teacher, episodes, packed, FORWARD, CPU)
        counts = [int(packed.target_mask[row].sum()) for row in range(len(episodes))]
        kept = [replace(episode, teacher_logits=part) for episode, part in
                zip(episodes, teacher_logits.split(counts), strict=True)]
        from_rollout, _ = distill_loss_step(TargetLogits(student), None, kept, packed, FORWARD, CPU, share_prefix=False)
        cross_entropy, no_router = sft_loss_step(TargetLogits(student), episodes, packed, CPU)
    torch.testing.assert_close(run, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(from_rollout, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cross_entropy, target_cross_entropy(student_logits, packed), atol=1e-4, rtol=1e-5)
    assert router is None and no_router is None


def test_loss_logits_are_fp32_under_bfloat16_autocast(tokenizer, episodes):
    """The body may run in bf16, but the vocabulary projection and everything after it are fp32."""
    student = tiny_model(seed=1)
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, output = logits_at_targets(student, packed)
        plain = student(input_ids=packed.input_ids, attention_mask=packed.attention_mask).logits
    assert plain.dtype == torch.bfloat16  # the model's own output projection runs in bf16 under autocast
    assert logits.dtype == torch.float32
    hidden = output.last_hidden_state[:, :-1][packed.target_mask]
    torch.testing.assert_close(logits, hidden.float() @ student.lm_head.weight.float().T, atol=0, rtol=0)
    assert token_divergence(logits, logits.detach() + 1.0, FORWARD).dtype == torch.float32


def test_cross_entropy_of_the_targets_by_hand(tokenizer, episodes):
    student = tiny_model(seed=1)
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    with torch.no_grad():
        logits, _ = logits_at_targets(student, packed)
    labels = packed.input_ids[:, 1:][packed.target_mask]
    by_hand = sum(-torch.log_softmax(row.double(), -1)[label].item() for row, label in zip(logits, labels, strict=True))
    assert target_cross_entropy(logits, packed).item() == pytest.approx(by_hand, rel=1e-6)


def minimind_router_loss_by_hand(gate_inputs: list[torch.Tensor], model) -> float:
    """MiniMind-3's MOEFeedForward aux loss (model_minimind.py at d65ef2c), summed over layers, in float64 loops:
    per layer E * sum_e load_e * mean_score_e * coef, load_e = share of tokens whose top-1 expert is e."""
    config, total = model.config, 0.0
    for layer, x in zip(model.model.layers, gate_inputs, strict=True):
        scores = torch.softmax(x.double() @ layer.mlp.gate.weight.double().T, dim=-1)
        tokens, experts = scores.shape
        chosen = scores.argmax(dim=-1).tolist()
        load = [sum(1 for c in chosen if c == e) / tokens for e in range(experts)]
        mean_score = [scores[:, e].mean().item() for e in range(experts)]
        total += experts * sum(load[e] * mean_score[e] for e in range(experts)) * config.router_aux_loss_coef
    return total


def gate_inputs_of(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """What each layer's router sees for ``ids`` (one unpadded row), via forward hooks."""
    seen = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda module, args, out: seen.append(args[0].detach()))
             for layer in model.model.layers]
    with torch.no_grad():
        model(input_ids=ids)
    for hook in hooks:
        hook.remove()
    return seen


def test_moe_router_loss_is_minimind_s_over_the_real_tokens(tokenizer, episodes):
    moe = MiniMindArch(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, use_moe=True)
    student, teacher = tiny_model(moe, seed=4), tiny_model(TINY_TEACHER, seed=2)
    assert router_aux_coef(student) == student.config.router_aux_loss_coef == 5e-4 and router_aux_coef(teacher) is None
    packed = pack_episodes(episodes, tokenizer.pad_token_id)
    assert (packed.attention_mask == 0).any()  # the batch is padded: padding must not count
    with torch.no_grad():
        _, output = logits_at_targets(student, packed, router_logits=True)
    ours = router_loss(student, output, packed.attention_mask).item()
    rows = [gate_inputs_of(student, torch.tensor([episode.ids])) for episode in episodes]
    per_layer = [torch.cat([row[layer] for row in rows]) for layer in range(moe.num_hidden_layers)]
    assert ours == pytest.approx(minimind_router_loss_by_hand(per_layer, student), rel=1e-5)
    assert ours > 0
