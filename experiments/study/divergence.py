"""How far a student is from each teacher on the student's own episodes, before any distillation.

    python -m experiments.study.divergence --data distill_prompts.jsonl --tokenizer PATH \\
        --student student.pth --student-arch 32,2,2,1 --teacher gold=gold.pth --teacher robust=robust.pth \\
        --teacher-arch 128,4,2,1 --prompts 96 --top-k 5 --seed 0 --out divergence.json

The student rolls out the first ``--prompts`` records at temperature 1 (as on-policy distillation samples them);
then, at every token it generated, each teacher and the student give their fp32 next-token distributions and this
reports, token-weighted, per horizon and over all: the forward KL(teacher || student) and the reverse KL (what
``loss.kl_direction`` forward_kl / reverse_kl minimize at temperature 1), top-1 agreement, and the top-k overlap
(the share of the teacher's k most likely next tokens that are among the student's k most likely), and both models'
entropies (nats: how spread out each one's next-token distribution is where the student sampled).

Per teacher it also reports what each direction asks of the student there (``pushes``): per token id, the probability
mass that a gradient step on the divergence summed over these tokens moves onto it (minus the gradient with respect to
the student's logits: ``p_teacher - p_student`` per position for forward KL, ``p_student * (KL - log p_student / p_teacher)``
for reverse KL), the ``--push-tokens`` largest, per 1,000 tokens; and the share of each divergence's sum that its top 1 %
of tokens carry (``top_percent_share``). Forward KL counts in full the teacher's confident guesses at positions the
student gives almost nothing, such as where its own sampled call has already broken; reverse KL weighs each position's
tokens by the student's own probability of them. Added after the second full run, whose forward-KL OPD students
learnt to end their calls in the middle of a number
(``experiments/study/notes/2026-12-06-why-forward-kl-broke-the-students.md``).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from common.atomic_write import atomic_write_json
from common.chat_records import load_agent_records
from common.generation.sampler import TokenSampler
from common.minimind.model import load_model
from common.minimind.spec import ModelSpec
from opd.config import LossConfig, RolloutConfig, SamplingConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.episode import pack_episodes, shared_prefix_length
from opd.rollouts.rollout import AgentRollout
from opd.training.loss import logits_at_targets, token_divergence

ARCHITECTURE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
BATCH = 16
TOP_PERCENT = 0.01


def token_agreement(student_logits: torch.Tensor, teacher_logits: torch.Tensor, top_k: int) -> dict[str, torch.Tensor]:
    """Per-token forward and reverse KL at temperature 1, top-1 agreement, top-k overlap and both entropies, each
    ``[tokens]``."""
    forward = token_divergence(student_logits, teacher_logits, LossConfig("forward_kl", 1.0, 0.5))
    reverse = token_divergence(student_logits, teacher_logits, LossConfig("reverse_kl", 1.0, 0.5))
    student_top = torch.topk(student_logits, top_k, dim=-1).indices
    teacher_top = torch.topk(teacher_logits, top_k, dim=-1).indices
    shared = (teacher_top[:, :, None] == student_top[:, None, :]).any(dim=-1).float().mean(dim=-1)
    return {"forward_kl": forward, "reverse_kl": reverse,
            "top1_agreement": (student_top[:, 0] == teacher_top[:, 0]).float(), "topk_overlap": shared,
            **{f"{name}_entropy": torch.distributions.Categorical(logits=logits.float()).entropy()
               for name, logits in (("student", student_logits), ("teacher", teacher_logits))}}


def logit_pushes(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per direction, minus the gradient of the divergence (temperature 1) summed over the ``[tokens, vocab]`` logits
    with respect to the student's logits, summed over the tokens: ``[vocab]``, fp64. Positive where a gradient step
    raises that token's probability."""
    student = torch.log_softmax(student_logits.double(), dim=-1)
    teacher = torch.log_softmax(teacher_logits.double(), dim=-1)
    reverse = (student.exp() * (student - teacher)).sum(dim=-1, keepdim=True)
    return {"forward_kl": (teacher.exp() - student.exp()).sum(dim=0),
            "reverse_kl": (student.exp() * (reverse - (student - teacher))).sum(dim=0)}


def top_percent_share(values: list[float], share: float = TOP_PERCENT) -> float:
    """The part of ``sum(values)`` (non-negative) that its largest ``share`` of entries carry (at least one)."""
    ordered = sorted(values, reverse=True)
    total = sum(ordered)
    return sum(ordered[:max(1, round(len(ordered) * share))]) / total if total else 0.0


def push_report(pushes: dict[str, torch.Tensor], values: dict[str, list[float]], tokens: int, tokenizer,
                count: int) -> dict:
    """The ``count`` token ids each direction raises most (mass per 1,000 tokens) and each one's top-1 % share."""
    report = {}
    for direction, mass in pushes.items():
        top = torch.topk(mass, count)
        report[direction] = {
            "top_percent_share": top_percent_share(values[direction]),
            "raises": [{"id": int(index), "token": tokenizer.decode([int(index)]), "per_1k_tokens": 1000 * float(v) / tokens}
                       for v, index in zip(top.values, top.indices, strict=True)]}
    return report


def measure(student, teachers: dict[str, torch.nn.Module], chat_format: ChatFormat, records, horizons: list[int],
            limits: RolloutConfig, *, top_k: int, seed: int, push_tokens: int) -> dict:
    """The student's episodes of ``records`` (temperature 1, ``seed``), scored by every teacher: per teacher, per
    horizon ("all" too), the token-weighted means of ``token_agreement``; the episodes' token counts; and per teacher
    the ``push_report`` of both directions."""
    sampler = TokenSampler(SamplingConfig(temperature=1.0), "cpu", seed)
    rollout = AgentRollout(student, chat_format, sampler, limits)
    sums = {name: defaultdict(lambda: defaultdict(float)) for name in teachers}
    tokens: dict[str, int] = defaultdict(int)
    pushes = {name: {} for name in teachers}
    values = {name: defaultdict(list) for name in teachers}
    for start in range(0, len(records), BATCH):
        episodes = rollout.run(records[start:start + BATCH])
        batch = pack_episodes(episodes, chat_format.pad_token_id)
        prefix = shared_prefix_length(episodes)
        owner = [horizon for horizon, episode in zip(horizons[start:start + BATCH], episodes, strict=True)
                 for _ in range(episode.assistant_tokens)]
        with torch.inference_mode():
            student_logits, _ = logits_at_targets(student, batch, prefix)
            for name, teacher in teachers.items():
                teacher_logits, _ = logits_at_targets(teacher, batch, prefix)
                for metric, per_token in token_agreement(student_logits, teacher_logits, top_k).items():
                    listed = per_token.tolist()
                    for horizon, value in zip(owner, listed, strict=True):
                        sums[name][str(horizon)][metric] += value
                        sums[name]["all"][metric] += value
                    if metric in ("forward_kl", "reverse_kl"):
                        values[name][metric] += listed
                for direction, mass in logit_pushes(student_logits, teacher_logits).items():
                    pushes[name][direction] = pushes[name].get(direction, 0) + mass
        for horizon in owner:
            tokens[str(horizon)] += 1
            tokens["all"] += 1
    return {"tokens": dict(tokens), "top_k": top_k, "teachers": {
        name: {group: {metric: total / tokens[group] for metric, total in metrics.items()}
               for group, metrics in by_group.items()} for name, by_group in sums.items()},
        "pushes": {name: push_report(pushes[name], values[name], tokens["all"], chat_format.tokenizer, push_tokens)
                   for name in teachers}}


def model_spec(checkpoint: str, architecture: str, tokenizer: str, name: str) -> ModelSpec:
    """A native checkpoint's model block from ``hidden_size,layers,heads,kv_heads``."""
    values = [int(part) for part in architecture.split(",")]
    if len(values) != len(ARCHITECTURE_KEYS):
        raise SystemExit(f"error: an architecture is {','.join(ARCHITECTURE_KEYS)}, got {architecture!r}")
    return ModelSpec(checkpoint=checkpoint, name=name, tokenizer=tokenizer, **dict(zip(ARCHITECTURE_KEYS, values,
                                                                                        strict=True)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="agent JSONL of prompts whose rows carry task.horizon")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--student", required=True, help="the student's native MiniMind .pth")
    parser.add_argument("--student-arch", required=True, help="hidden_size,layers,heads,kv_heads")
    parser.add_argument("--teacher", action="append", required=True, help="NAME=PATH of a teacher .pth (repeat)")
    parser.add_argument("--teacher-arch", required=True, help="hidden_size,layers,heads,kv_heads of every teacher")
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--push-tokens", type=int, default=5, help="token ids listed per direction in pushes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--max-gen-len", type=int, default=64)
    parser.add_argument("--max-total-len", type=int, default=1024)
    parser.add_argument("--out", required=True, help="the JSON report")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    student, tokenizer = load_model(model_spec(args.student, args.student_arch, args.tokenizer, "student"), role="student")
    teachers = {}
    for entry in args.teacher:
        name, _, path = entry.partition("=")
        teachers[name], _ = load_model(model_spec(path, args.teacher_arch, args.tokenizer, name), role=f"teacher {name}")
    records, _ = load_agent_records(args.data)
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    records, horizons = records[:args.prompts], [row["task"]["horizon"] for row in rows[:args.prompts]]
    limits = RolloutConfig(args.max_turns, args.max_gen_len, args.max_total_len, False)
    report = measure(student.eval(), {name: model.eval() for name, model in teachers.items()}, ChatFormat(tokenizer),
                     records, horizons, limits, top_k=args.top_k, seed=args.seed, push_tokens=args.push_tokens)
    atomic_write_json(args.out, {"student": args.student, "prompts": len(records), "seed": args.seed, **report})
    print(json.dumps({key: report[key] for key in ("teachers", "pushes")}, indent=1))


if __name__ == "__main__":
    main()
