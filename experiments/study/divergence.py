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
from opd.chat_format import ChatFormat
from opd.config import LossConfig, RolloutConfig, SamplingConfig
from opd.episodes import pack_episodes, shared_prefix_length
from opd.loss import logits_at_targets, token_divergence
from opd.rollout import AgentRollout

ARCHITECTURE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
BATCH = 16


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


def measure(student, teachers: dict[str, torch.nn.Module], chat_format: ChatFormat, records, horizons: list[int],
            limits: RolloutConfig, *, top_k: int, seed: int) -> dict:
    """The student's episodes of ``records`` (temperature 1, ``seed``), scored by every teacher: per teacher, per
    horizon ("all" too), the token-weighted means of ``token_agreement``; plus the episodes' token counts."""
    sampler = TokenSampler(SamplingConfig(temperature=1.0), "cpu", seed)
    rollout = AgentRollout(student, chat_format, sampler, limits)
    sums = {name: defaultdict(lambda: defaultdict(float)) for name in teachers}
    tokens: dict[str, int] = defaultdict(int)
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
                for metric, values in token_agreement(student_logits, teacher_logits, top_k).items():
                    for horizon, value in zip(owner, values.tolist(), strict=True):
                        sums[name][str(horizon)][metric] += value
                        sums[name]["all"][metric] += value
        for horizon in owner:
            tokens[str(horizon)] += 1
            tokens["all"] += 1
    return {"tokens": dict(tokens), "top_k": top_k, "teachers": {
        name: {group: {metric: total / tokens[group] for metric, total in metrics.items()}
               for group, metrics in by_group.items()} for name, by_group in sums.items()}}


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
                     records, horizons, limits, top_k=args.top_k, seed=args.seed)
    atomic_write_json(args.out, {"student": args.student, "prompts": len(records), "seed": args.seed, **report})
    print(json.dumps(report["teachers"], indent=1))


if __name__ == "__main__":
    main()
