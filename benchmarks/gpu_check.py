"""The GPU path measured: OPD steps of the 768x8 MiniMind pair in bf16 autocast, phase by phase (``make gpu-check``).

    python -m benchmarks.gpu_check [--batch-sizes 8,32] [--turns 3] [--gen-len 128] [--steps 3] [--peak-tflops 989]

Per batch size it runs ``--steps`` full OPD steps (the first is a warm-up and is not counted) on random-init
768x8 student and teacher models (weights do not change the cost) with fixed episode shapes: every episode
has ``--turns`` scripted turns of exactly ``--gen-len`` tokens (tool call, tool call, answer), while every
forward, observation prefill, backward and optimizer step is real. Each phase is timed between
``torch.cuda.synchronize()`` calls: rollout (prefill, decode, observations), teacher (forward at the
targets), student (forward and backward), optimizer (clip and AdamW step). It prints assistant (target)
tokens per second of each phase and of the whole step, peak GPU memory (``max_memory_allocated``) and model
FLOPs utilisation: the step's model FLOPs — 2·N per token of a forward, 6·N per token of a training forward
and backward, N the parameters without the embedding table, plus 2·H·V per target token for the
vocabulary projection (x3 in training) and 2·H·V per sampled token in the rollout; attention scores are
left out — over step time times ``--peak-tflops`` (dense bf16 peak; H100/H200 SXM: 989).

``--device cpu --dtype float32 --size tiny`` runs the same script on a CPU (the test suite does, so the script
never rots); the figures only mean something on a GPU.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.opd_training import PAIRS, bench_records, bench_tokenizer, scripted_turns
from common.atomic_write import atomic_write_json
from common.minimind.model import build_model
from common.minimind.precision import resolve_precision
from common.user_errors import UserError, exit_on_user_error
from opd.config import LossConfig, OptimConfig, RolloutConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.episode import pack_episodes, shared_prefix_length
from opd.rollouts.rollout import AgentRollout
from opd.training.loss import TargetLogits, logits_at_targets, token_divergence
from opd.training.optimization import Optimization
from standins.scripted_sampler import ScriptedSampler

PHASES = ("rollout", "teacher", "student", "optimizer")
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}


def known_peak_tflops(device: torch.device) -> float | None:
    """Dense bf16 peak of a known GPU (by its name), else None."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in name), None)


def non_embedding_parameters(model: torch.nn.Module) -> int:
    """Parameters outside the (tied) embedding table: what a token's matmuls touch besides the vocabulary."""
    return sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()


def synchronized(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def measure(batch: int, args, tokenizer, device: torch.device, precision) -> dict:
    """Time ``args.steps`` OPD steps of one batch size; returns per-phase seconds, tokens, FLOPs and memory."""
    student_arch, teacher_arch = PAIRS[args.size]
    torch.manual_seed(0)
    student = build_model(student_arch).to(device)
    teacher = build_model(teacher_arch).to(device).eval().requires_grad_(False)
    chat_format = ChatFormat(tokenizer)
    script = scripted_turns(tokenizer, args.turns, args.gen_len)
    records = bench_records(batch, shared_system_prompt=True)
    rollout = AgentRollout(student, chat_format, ScriptedSampler({r.source: script for r in records}),
                           RolloutConfig(args.turns, args.gen_len, 1 << 15, open_thinking=False),
                           autocast=precision.autocast)
    optimization = Optimization(student, OptimConfig(1e-6, 0.0, "constant", 0, None, 1.0), args.steps, precision)
    forward, loss_settings = TargetLogits(student), LossConfig("forward_kl", 1.0, 0.5)
    hidden, vocab = student.config.hidden_size, student.config.vocab_size
    n_student, n_teacher = non_embedding_parameters(student), non_embedding_parameters(teacher)
    seconds = dict.fromkeys(PHASES, 0.0)
    tokens = flops = 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(args.steps):
        marks = [synchronized(device)]
        episodes = rollout.run(records)
        marks.append(synchronized(device))
        packed = pack_episodes(episodes, tokenizer.pad_token_id).to(device)
        prefix = shared_prefix_length(episodes)
        with torch.no_grad(), precision.autocast():
            teacher_logits, _ = logits_at_targets(teacher, packed, prefix)
        marks.append(synchronized(device))
        student.train()
        with precision.autocast():
            student_logits, _ = forward(packed.input_ids, packed.attention_mask, packed.target_mask, prefix)
        optimization.backward(token_divergence(student_logits, teacher_logits, loss_settings).sum() / packed.target_count)
        marks.append(synchronized(device))
        optimization.step()
        marks.append(synchronized(device))
        if step == 0:
            continue  # warm-up: kernels, allocator, caches
        targets = packed.target_count
        context = int(packed.attention_mask.sum()) - (len(episodes) - 1) * prefix  # the shared prefix runs once
        for phase, (start, end) in zip(PHASES, zip(marks, marks[1:], strict=False), strict=True):
            seconds[phase] += end - start
        tokens += targets
        flops += (2 * n_student * context + 2 * hidden * vocab * targets  # rollout: every context token once
                  + 2 * n_teacher * context + 2 * hidden * vocab * targets  # teacher forward
                  + 6 * n_student * context + 6 * hidden * vocab * targets)  # student forward and backward
    peak = torch.cuda.max_memory_allocated(device) / (1 << 30) if device.type == "cuda" else None
    return {"batch_size": batch, "seconds": seconds, "assistant_tokens": tokens, "model_flops": flops,
            "peak_gpu_memory_gib": peak}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="768", choices=sorted(PAIRS))
    parser.add_argument("--batch-sizes", default="8,32")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="steps per batch size; the first is a warm-up")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense peak for MFU (default: by GPU name)")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--out", default="out/bench/gpu_check.json")
    args = parser.parse_args(argv)
    if args.steps < 2:
        raise UserError("--steps must be at least 2 (the first step is a warm-up)")
    precision = resolve_precision(args.device, args.dtype)
    device = precision.device
    peak = args.peak_tflops or known_peak_tflops(device)
    tokenizer, tokenizer_name = bench_tokenizer(args.tokenizer)
    console = Console(width=140)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    table = Table(title=f"OPD step on {name}, {args.size} pair, {precision.dtype_name}, {args.turns} turns x "
                        f"{args.gen_len} tokens")
    for column in ("batch", *(f"{p} tok/s" for p in PHASES), "step tok/s", "peak GiB", "MFU"):
        table.add_column(column, justify="right")
    results = {"device": name, "size": args.size, "dtype": precision.dtype_name, "turns": args.turns,
               "gen_len": args.gen_len, "tokenizer": tokenizer_name, "peak_tflops": peak, "runs": []}
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        with console.status(f"batch {batch}: {args.steps} steps"):
            run = measure(batch, args, tokenizer, device, precision)
        total = sum(run["seconds"].values())
        run["tokens_per_s"] = {phase: run["assistant_tokens"] / s for phase, s in run["seconds"].items()}
        run["step_tokens_per_s"] = run["assistant_tokens"] / total
        run["mfu"] = run["model_flops"] / total / (peak * 1e12) if peak else None
        results["runs"].append(run)
        table.add_row(str(batch), *(f"{run['tokens_per_s'][p]:.0f}" for p in PHASES), f"{run['step_tokens_per_s']:.0f}",
                      "-" if run["peak_gpu_memory_gib"] is None else f"{run['peak_gpu_memory_gib']:.2f}",
                      "-" if run["mfu"] is None else f"{run['mfu']:.1%}")
    console.print(table)
    atomic_write_json(Path(args.out), results)
    console.print(f"written {args.out}")
    return results


if __name__ == "__main__":
    with exit_on_user_error():
        main()
