"""CPU throughput and memory of the OPD rollout and trainer, on one process and on two (``make bench-opd``).

    python -m benchmarks.opd_training [--sizes tiny,768] [--batch-sizes 1,8] [--steps 2] [--out out/bench/opd.json]
    python -m benchmarks.opd_training --memory [--sizes 768] [--batch-sizes 8]     # peak RSS of a step, checkpointing off/on
    python -m benchmarks.opd_training --processes [--sizes tiny,768]              # 1 vs 2 torchrun processes, 1 thread each
    python -m benchmarks.opd_training --guidance [--sizes 768] [--batch-sizes 8]  # rollout and step cost of each guidance option

decode: rollout tokens/s (one turn of ``turns * gen_len`` sampled tokens, temperature 1) against a plain
KV-cached decode loop (``[batch, 1]`` forwards on one cache, same sampling) of the same model and batch size,
alternated ``--repeats`` times, best of each kept.
train: optimizer steps/s and assistant tokens/s of full OPD steps (rollout + frozen-teacher forward +
student update) with fixed episode shapes: the student's turns are scripted (a tool call, a tool call, a
final answer; each exactly ``gen_len`` tokens) while every forward, observation and update is real. Records
share one system prompt and tool list (computed once per batch); at batch sizes above 1 the same is also
timed with a different system prompt per record (nothing shared). The decode comparison uses the latter.
memory: the peak resident set (``ru_maxrss``) of a process that builds the pair and makes one such training
step, once with the student's activation checkpointing off and once on, each in a fresh spawned process.
processes: rollout and training tokens/s of ``opd/train.py`` itself, as one process and as ``torchrun
--nproc_per_node 2``, one thread per process, on the same global batch of prompts (random-init native
checkpoints; sampled turns of a random model run to ``--gen-len``); the first step is a warm-up.
guidance: what the teacher in the decode loop costs: one sampled turn of ``turns * gen_len`` tokens per record
(temperature 1, distinct system prompts) rolled out plainly and under each guidance option (``token_mix=0.2``,
``top_k=25``, ``turn_share=0.5``), then the update of those episodes (plain: a teacher forward for the loss;
guided: the logits the rollout kept), alternated ``--repeats`` times, the fastest per token of each kept; the
rollout's seconds inside each model's forward calls (body and output projection) are timed apart from the rest
(sampling, the guidance policy, bookkeeping).
Models are random-init MiniMind architectures (weights do not change the cost); the tokenizer is
$MINIMIND_TOKENIZER, ../shared/minimind3-tokenizer, or the stand-in.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import DynamicCache

from common.atomic_write import atomic_write_json
from common.chat_records import AgentRecord
from common.generation.sampler import TokenSampler, draw
from common.minimind.model import (
    MiniMindArch,
    build_model,
    cache_keyword,
    enable_activation_checkpointing,
    save_native,
)
from common.minimind.precision import resolve_precision
from common.minimind.standin_tokenizer import build_standin_tokenizer
from common.minimind.tiny import tiny_arch
from common.minimind.tokenizer import load_tokenizer
from opd.config import GuidanceConfig, LossConfig, OptimConfig, RolloutConfig, SamplingConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.episode import pack_episodes
from opd.rollouts.guidance import BehaviourPolicy
from opd.rollouts.rollout import AgentRollout
from opd.training.loss import TargetLogits, distill_loss_step
from opd.training.optimization import Optimization
from standins.scripted_sampler import ScriptedSampler
from tools.mock_tools import tool_schemas

REPO_ROOT = Path(__file__).resolve().parents[1]
MINIMIND_768 = MiniMindArch(hidden_size=768, num_hidden_layers=8)
PAIRS = {  # size -> (student, teacher)
    "tiny": (tiny_arch("student"), tiny_arch("teacher")),
    "768": (MINIMIND_768, MINIMIND_768),
}
FILLER = " Let me work through this carefully before answering."


def bench_tokenizer(path: str | None):
    """The tokenizer to time with, and a note saying which one it is."""
    candidates = [path, os.environ.get("MINIMIND_TOKENIZER"), str(REPO_ROOT.parent / "shared" / "minimind3-tokenizer")]
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            return load_tokenizer(candidate), candidate
    return load_tokenizer(str(build_standin_tokenizer(tempfile.mkdtemp(prefix="opd-bench-tok-")))), "stand-in"


def bench_records(count: int, *, shared_system_prompt: bool) -> list[AgentRecord]:
    """Agent prompts declaring all six mock tools; one system prompt for all, or a different one per record."""
    return [AgentRecord(messages=[{"role": "system", "content": "You are a helpful assistant." if shared_system_prompt
                                   else f"Assistant {i}: you are a helpful assistant."},
                                  {"role": "user", "content": f"Weather in city {i}, and what is {i} * 17?"}],
                        tools=tool_schemas(), source=f"bench:{i}") for i in range(count)]


def scripted_turns(tokenizer, turns: int, gen_len: int) -> list[list[int]]:
    """``turns`` turns of exactly ``gen_len`` ids: tool calls (weather, then math) and a final answer, each with EOS."""
    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    filler = encode(FILLER * (gen_len // 4 + 1))
    calls = [encode('<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "Paris"}}\n</tool_call>'),
             encode('<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "12 * 17"}}\n</tool_call>')]
    script = []
    for turn in range(turns):
        tail = calls[turn % 2] if turn < turns - 1 else []
        if len(tail) + 1 > gen_len:
            raise ValueError(f"gen_len {gen_len} is too short for a scripted tool call ({len(tail) + 1} tokens)")
        script.append(filler[:gen_len - 1 - len(tail)] + tail + [tokenizer.eos_token_id])
    return script


@torch.inference_mode()
def plain_decode(model, prompt: list[int], batch: int, new_tokens: int, seed: int) -> float:
    """Tokens/s of the simplest KV-cached sampling loop: prefill, then ``[batch, 1]`` forwards on one cache."""
    generator = torch.Generator().manual_seed(seed)
    cache, key = DynamicCache(config=model.config), cache_keyword(model)
    started = time.perf_counter()
    ids = torch.tensor([prompt] * batch)
    logits = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{key: cache}).logits[:, -1]
    for _ in range(new_tokens):
        uniform = torch.rand(batch, 1, generator=generator, dtype=torch.float64)
        tokens = draw(torch.softmax(logits.float(), dim=-1), uniform)[:, None]  # the rollout's sampler's draw
        logits = model(input_ids=tokens, use_cache=True, logits_to_keep=1, **{key: cache}).logits[:, -1]
    return batch * new_tokens / (time.perf_counter() - started)


def rollout_decode(model, chat_format: ChatFormat, records: list[AgentRecord], new_tokens: int, seed: int) -> float:
    """Tokens/s of the OPD rollout generating one turn of up to ``new_tokens`` sampled tokens per record."""
    sampler = TokenSampler(SamplingConfig(), "cpu", seed)
    rollout = AgentRollout(model, chat_format, sampler, RolloutConfig(1, new_tokens, 1 << 15, open_thinking=False))
    started = time.perf_counter()
    episodes = rollout.run(records)
    return sum(e.assistant_tokens for e in episodes) / (time.perf_counter() - started)


def train_throughput(student, teacher, chat_format: ChatFormat, records: list[AgentRecord],
                     script: list[list[int]], batch: int, steps: int, *, checkpointing: bool = False) -> dict:
    """Full OPD steps on scripted-shape episodes: steps/s, assistant tokens/s, and where the time went."""
    if checkpointing:
        enable_activation_checkpointing(student)
    sampler = ScriptedSampler({record.source: script for record in records})
    limits = RolloutConfig(len(script), max(len(turn) for turn in script), 1 << 15, open_thinking=False)
    rollout = AgentRollout(student, chat_format, sampler, limits)
    precision = resolve_precision("cpu", "float32")
    optimization = Optimization(student, OptimConfig(1e-6, 0.0, "constant", 0, None, 1.0), steps, precision)
    loss = LossConfig("forward_kl", 1.0, 0.5)
    rollout_s = update_s = 0.0
    tokens = turns = 0
    for step in range(steps):
        began = time.perf_counter()
        episodes = rollout.run(records[step * batch:(step + 1) * batch])
        rolled = time.perf_counter()
        packed = pack_episodes(episodes, chat_format.pad_token_id)
        kl_sum, _ = distill_loss_step(TargetLogits(student), teacher, episodes, packed, loss, precision,
                                      share_prefix=not checkpointing)
        optimization.backward(kl_sum / packed.target_count)
        optimization.step()
        rollout_s += rolled - began
        update_s += time.perf_counter() - rolled
        tokens += sum(e.assistant_tokens for e in episodes)
        turns += sum(len(e.turns) for e in episodes)
    total = rollout_s + update_s
    return {"steps_per_s": steps / total, "assistant_tokens_per_s": tokens / total,
            "rollout_tokens_per_s": tokens / rollout_s, "rollout_share": rollout_s / total,
            "mean_turns": turns / (steps * batch), "seconds": total}


def _step_peak_rss(connection, size: str, batch: int, turns: int, gen_len: int, checkpointing: bool,
                   tokenizer_path: str | None) -> None:
    tokenizer, _ = bench_tokenizer(tokenizer_path)
    student_arch, teacher_arch = PAIRS[size]
    torch.manual_seed(0)
    student, teacher = build_model(student_arch), build_model(teacher_arch).eval().requires_grad_(False)
    train_throughput(student, teacher, ChatFormat(tokenizer), bench_records(batch, shared_system_prompt=True),
                     scripted_turns(tokenizer, turns, gen_len), batch, 1, checkpointing=checkpointing)
    connection.send(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20))  # KiB -> GiB
    connection.close()


def step_peak_rss(size: str, batch: int, turns: int, gen_len: int, checkpointing: bool, tokenizer: str | None) -> float:
    """Peak RSS (GiB) of a fresh process that builds the pair and makes one training step."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_step_peak_rss, args=(sender, size, batch, turns, gen_len, checkpointing,
                                                            tokenizer))
    process.start()
    sender.close()
    try:
        peak = receiver.recv()
    except EOFError:
        raise RuntimeError(f"the process measuring {size} batch {batch} failed (its error is above)") from None
    finally:
        process.join()
    return peak


def memory(args, console: Console) -> dict:
    """Peak RSS of one training step per size and batch, activation checkpointing off and on."""
    table = Table(title=f"peak RSS of one OPD step (CPU, fp32, {args.turns} turns x {args.gen_len} tokens)")
    for column in ("pair", "batch", "checkpointing off GiB", "checkpointing on GiB", "on / off"):
        table.add_column(column, justify="right")
    runs = []
    for size in args.sizes.split(","):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            with console.status(f"{size} batch {batch}: one step, checkpointing off and on"):
                off, on = (step_peak_rss(size, batch, args.turns, args.gen_len, flag, args.tokenizer)
                           for flag in (False, True))
            runs.append({"pair": size, "batch_size": batch, "peak_rss_gib_off": off, "peak_rss_gib_on": on})
            table.add_row(size, str(batch), f"{off:.2f}", f"{on:.2f}", f"{on / off:.2f}")
    console.print(table)
    return {"kind": "memory", "turns": args.turns, "gen_len": args.gen_len, "runs": runs}


def write_native_pair(size: str, folder: Path) -> dict[str, Path]:
    """Random-init native checkpoints of a pair, for runs of ``opd/train.py``."""
    paths = {}
    for offset, (role, arch) in enumerate(zip(("student", "teacher"), PAIRS[size], strict=True)):
        torch.manual_seed(offset)
        paths[role] = save_native(build_model(arch), folder / f"{size}_{role}.pth")
    return paths


def train_command(size: str, paths: dict, data: Path, out: Path, args, tokenizer: str) -> list[str]:
    student_arch, teacher_arch = PAIRS[size]
    return [*(f"{role}.{key}={getattr(arch, key)}" for role, arch in (("student", student_arch), ("teacher", teacher_arch))
              for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")),
            f"student.checkpoint={paths['student']}", f"teacher.checkpoint={paths['teacher']}", f"data={data}",
            f"tokenizer={tokenizer}", "device=cpu", f"batch_size={args.process_batch}", f"max_steps={args.steps + 1}",
            "rollout.max_turns=1", f"rollout.max_gen_len={args.gen_len}", "rollout.max_total_len=4096",
            f"out_dir={out}", f"hydra.run.dir={out / 'run'}", "save_interval=1000000"]


def processes(args, console: Console) -> dict:
    """Rollout and training tokens/s of opd/train.py as 1 process and as 2 torchrun processes (1 thread each)."""
    tokenizer = args.tokenizer or bench_tokenizer(None)[1]
    if tokenizer == "stand-in":
        tokenizer = str(build_standin_tokenizer(tempfile.mkdtemp(prefix="opd-bench-tok-")))
    table = Table(title=f"opd/train.py on 1 vs 2 processes (CPU, 1 thread each, global batch {args.process_batch}, "
                        f"one sampled turn of {args.gen_len} tokens)")
    for column in ("pair", "processes", "rollout tok/s", "train tok/s", "speed-up"):
        table.add_column(column, justify="right")
    runs = []
    with tempfile.TemporaryDirectory(prefix="opd-bench-processes-") as folder:
        root = Path(folder)
        data = root / "prompts.jsonl"
        rows = [{"messages": record.messages, "tools": record.tools}
                for record in bench_records(args.process_batch * (args.steps + 1), shared_system_prompt=True)]
        data.write_text("".join(json.dumps(row) + "\n" for row in rows))
        for size in args.sizes.split(","):
            paths, base = write_native_pair(size, root), None
            for count in (1, 2):
                out = root / f"{size}-{count}"
                launcher = [sys.executable, "opd/train.py"] if count == 1 else [
                    sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={count}",
                    "opd/train.py"]
                with console.status(f"{size}: {count} process(es)"):
                    subprocess.run([*launcher, *train_command(size, paths, data, out, args, tokenizer)], cwd=REPO_ROOT,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True, capture_output=True)
                steps = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()][1:]
                tokens = sum(step["assistant_tokens"] for step in steps)
                rollout_s = sum(step["rollout_s"] for step in steps)
                train_s = sum(step["rollout_s"] + step["update_s"] for step in steps)
                run = {"pair": size, "processes": count, "rollout_tokens_per_s": tokens / rollout_s,
                       "train_tokens_per_s": tokens / train_s, "steps": len(steps)}
                base = base or run
                runs.append(run)
                table.add_row(size, str(count), f"{run['rollout_tokens_per_s']:.1f}", f"{run['train_tokens_per_s']:.1f}",
                              f"{run['train_tokens_per_s'] / base['train_tokens_per_s']:.2f}")
    console.print(table)
    return {"kind": "processes", "global_batch": args.process_batch, "gen_len": args.gen_len, "runs": runs}


GUIDANCE_OPTIONS = {"plain": None, "token_mix=0.2": GuidanceConfig(None, None, 0.2, None),
                    "top_k=25": GuidanceConfig(None, None, None, 25), "turn_share=0.5": GuidanceConfig(0.5, 0.5, None, None)}


class ForwardTimer:
    """Seconds spent inside the forward calls of ``modules`` (hooks around each call), until ``remove``."""

    def __init__(self, *modules: torch.nn.Module) -> None:
        self.seconds, self._started = 0.0, 0.0
        self._handles = [hook for module in modules for hook in (
            module.register_forward_pre_hook(self._start), module.register_forward_hook(self._stop))]

    def _start(self, module, args) -> None:
        self._started = time.perf_counter()

    def _stop(self, module, args, output) -> None:
        self.seconds += time.perf_counter() - self._started

    def remove(self) -> float:
        for handle in self._handles:
            handle.remove()
        return self.seconds


def guided_step(student, teacher, chat_format: ChatFormat, records: list[AgentRecord], settings: GuidanceConfig | None,
                new_tokens: int, seed: int, *, update: bool = True) -> dict:
    """One sampled turn per record, plain or guided, then (``update``) the update on those episodes: seconds of each,
    tokens."""
    sampler = TokenSampler(SamplingConfig(), "cpu", seed)
    rollout = AgentRollout(student, chat_format, sampler, RolloutConfig(1, new_tokens, 1 << 15, open_thinking=False))
    policy = BehaviourPolicy(teacher, settings, sampler, list(range(len(records)))) if settings else None
    precision = resolve_precision("cpu", "float32")
    optimization = Optimization(student, OptimConfig(1e-6, 0.0, "constant", 0, None, 1.0), 1, precision)
    timers = [ForwardTimer(model.model, model.lm_head) for model in (student, teacher)]
    started = time.perf_counter()
    episodes = rollout.run(records, policy)
    rolled = time.perf_counter()
    student_forward_s, teacher_forward_s = (timer.remove() for timer in timers)
    if update:
        packed = pack_episodes(episodes, chat_format.pad_token_id)
        kl_sum, _ = distill_loss_step(TargetLogits(student), teacher, episodes, packed,
                                      LossConfig("forward_kl", 1.0, 0.5), precision)
        optimization.backward(kl_sum / packed.target_count)
        optimization.step()
    tokens = sum(e.assistant_tokens for e in episodes)
    return {"tokens": tokens, "rollout_s": rolled - started, "update_s": time.perf_counter() - rolled,
            "student_forward_s": student_forward_s, "teacher_forward_s": teacher_forward_s,
            "teacher_token_share": sum(e.teacher_tokens for e in episodes) / tokens}


def step_seconds_per_token(timed: dict) -> float:
    return (timed["rollout_s"] + timed["update_s"]) / timed["tokens"]


def guidance_costs(args, console: Console) -> dict:
    """Rollout and step tokens/s of plain OPD and of each guidance option, per size and batch size."""
    tokenizer, tokenizer_name = bench_tokenizer(args.tokenizer)
    chat_format, new_tokens = ChatFormat(tokenizer), args.turns * args.gen_len
    table = Table(title=f"guided rollouts (CPU, {torch.get_num_threads()} threads, fp32, one sampled turn of "
                        f"{new_tokens} tokens per record)")
    for column in ("pair", "batch", "policy", "rollout tok/s", "rollout time vs plain", "student fwd s",
                   "teacher fwd s", "other s", "step tok/s", "step time vs plain", "teacher share"):
        table.add_column(column, justify="right")
    runs = []
    for size in args.sizes.split(","):
        student_arch, teacher_arch = PAIRS[size]
        torch.manual_seed(0)
        student, teacher = build_model(student_arch), build_model(teacher_arch).eval().requires_grad_(False)
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            records = bench_records(batch, shared_system_prompt=False)
            best = {}
            with console.status(f"{size} batch {batch}: plain and guided rollouts"):
                for settings in GUIDANCE_OPTIONS.values():  # warm-up (rollouts: an update costs minutes at 768x8)
                    guided_step(student, teacher, chat_format, records, settings, 4, seed=0, update=False)
                for repeat in range(args.repeats):  # alternate, keep the fastest of each (robust to other load)
                    for name, settings in GUIDANCE_OPTIONS.items():
                        timed = guided_step(student, teacher, chat_format, records, settings, new_tokens, seed=repeat)
                        console.print(f"[dim]{size} batch {batch} repeat {repeat} {name}: {timed['tokens']} tokens, "
                                      f"rollout {timed['rollout_s']:.1f} s, update {timed['update_s']:.1f} s[/]")
                        if name not in best or step_seconds_per_token(timed) < step_seconds_per_token(best[name]):
                            best[name] = timed
            plain = best["plain"]
            for name, timed in best.items():
                run = {"pair": size, "batch_size": batch, "policy": name, **timed,
                       "rollout_tokens_per_s": timed["tokens"] / timed["rollout_s"],
                       "step_tokens_per_s": timed["tokens"] / (timed["rollout_s"] + timed["update_s"])}
                # seconds per token relative to plain OPD's (episodes of other writers differ a little in length)
                run["rollout_time_vs_plain"] = (timed["rollout_s"] / timed["tokens"]) / (plain["rollout_s"] / plain["tokens"])
                run["step_time_vs_plain"] = ((timed["rollout_s"] + timed["update_s"]) / timed["tokens"]) / (
                    (plain["rollout_s"] + plain["update_s"]) / plain["tokens"])
                runs.append(run)
                other = timed["rollout_s"] - timed["student_forward_s"] - timed["teacher_forward_s"]
                table.add_row(size, str(batch), name, f"{run['rollout_tokens_per_s']:.1f}",
                              f"{run['rollout_time_vs_plain']:.2f}x", f"{timed['student_forward_s']:.2f}",
                              f"{timed['teacher_forward_s']:.2f}", f"{other:.2f}", f"{run['step_tokens_per_s']:.1f}",
                              f"{run['step_time_vs_plain']:.2f}x", f"{timed['teacher_token_share']:.2f}")
    console.print(table)
    return {"kind": "guidance", "tokenizer": tokenizer_name, "new_tokens": new_tokens, "runs": runs}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="tiny,768", help=f"comma list of {', '.join(PAIRS)}")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps timed per size and batch size")
    parser.add_argument("--repeats", type=int, default=2, help="decode runs of each kind (best one reported)")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--out", default="out/bench/opd_benchmark.json")
    parser.add_argument("--memory", action="store_true", help="peak RSS of a step, activation checkpointing off/on")
    parser.add_argument("--processes", action="store_true", help="opd/train.py on 1 vs 2 torchrun processes")
    parser.add_argument("--process-batch", type=int, default=8, help="global batch of the --processes runs")
    parser.add_argument("--guidance", action="store_true", help="rollout and step cost of each guidance option")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=160 if args.guidance else 120)  # the guidance table has 11 columns
    if args.memory or args.processes or args.guidance:
        results = (memory(args, console) if args.memory else processes(args, console) if args.processes
                   else guidance_costs(args, console))
        atomic_write_json(Path(args.out), results)
        console.print(f"written {args.out}")
        return results
    tokenizer, tokenizer_name = bench_tokenizer(args.tokenizer)
    chat_format = ChatFormat(tokenizer)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    records = {shared: bench_records(max(batch_sizes) * args.steps, shared_system_prompt=shared)
               for shared in (True, False)}
    distinct = records[False]
    script = scripted_turns(tokenizer, args.turns, args.gen_len)
    new_tokens = args.turns * args.gen_len
    results = {"threads": torch.get_num_threads(), "tokenizer": tokenizer_name, "turns": args.turns,
               "gen_len": args.gen_len, "prompt_tokens": len(chat_format.prompt_ids(distinct[0])), "runs": []}
    table = Table(title=f"opd benchmark (CPU, {results['threads']} threads, fp32)")
    for column in ("pair", "batch", "plain tok/s", "rollout tok/s", "ratio", "steps/s", "tok/s", "rollout share",
                   "tok/s distinct"):
        table.add_column(column, justify="right")
    for size in args.sizes.split(","):
        student_arch, teacher_arch = PAIRS[size]
        torch.manual_seed(0)
        student, teacher = build_model(student_arch), build_model(teacher_arch).eval().requires_grad_(False)
        for batch in batch_sizes:
            with console.status(f"{size} batch {batch}: decode"):
                plain_decode(student, chat_format.prompt_ids(distinct[0]), batch, 4, seed=0)  # warm-up
                rollout_decode(student, chat_format, distinct[:batch], 4, seed=0)
                plain = rolled = 0.0
                for repeat in range(args.repeats):  # alternate, keep the best of each (robust to other load)
                    plain = max(plain, plain_decode(student, chat_format.prompt_ids(distinct[0]), batch, new_tokens,
                                                    seed=repeat))
                    rolled = max(rolled, rollout_decode(student, chat_format, distinct[:batch], new_tokens, seed=repeat))
            run = {"pair": size, "batch_size": batch, "plain_decode_tokens_per_s": plain,
                   "rollout_decode_tokens_per_s": rolled, "rollout_vs_plain": rolled / plain}
            for shared in (True, False) if batch > 1 else (True,):  # one row has no prefix to share
                label = "shared system prompt" if shared else "distinct system prompts"
                with console.status(f"{size} batch {batch}: {args.steps} training steps, {label}"):
                    run["train_shared_prompt" if shared else "train_distinct_prompts"] = train_throughput(
                        student, teacher, chat_format, records[shared], script, batch, args.steps)
            results["runs"].append(run)
            train, other = run["train_shared_prompt"], run.get("train_distinct_prompts")
            table.add_row(size, str(batch), f"{plain:.1f}", f"{rolled:.1f}", f"{rolled / plain:.2f}",
                          f"{train['steps_per_s']:.4f}", f"{train['assistant_tokens_per_s']:.1f}",
                          f"{train['rollout_share']:.2f}",
                          f"{other['assistant_tokens_per_s']:.1f}" if other else "(same)")
            console.print(run)
    console.print(table)
    atomic_write_json(Path(args.out), results)
    console.print(f"written {args.out}")
    return results


if __name__ == "__main__":
    main()
