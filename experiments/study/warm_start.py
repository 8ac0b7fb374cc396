"""Pick a warm student (or the teacher): the first SFT checkpoint whose greedy accuracy on validation prompts reaches
a threshold.

    python -m experiments.study.warm_start --run-dir seed0/student --stem student_warm_64 --arch 64,2,2,1 \\
        --data distill_prompts.jsonl --tokenizer PATH --prompts 120 --min-accuracy 0.5 --out seed0/student/warm.pth

A small model learns the chain task at a cliff: held-out accuracy jumps from chance to near 1 within ~100 SFT steps,
at a step that varies with the seed (and with the machine's float rounding). A fixed number of steps would start
the arms from a cold student in one seed and a finished one in another. So the student's SFT keeps its weights
every few steps (``{stem}_step{N}.pth``), and this picks, in step order, the first whose accuracy on the first
``--prompts`` validation prompts (the distillation split, never the held-out one) is at least ``--min-accuracy``;
it copies those weights to ``--out`` (as safetensors when it ends so) and writes every accuracy it measured to ``{out}.json``. When none reaches the
threshold it fails, naming the best step, or with ``--best-if-none`` picks the best (the earliest of equals) and
says so (``"reached": false`` in its file): a seed that learns slowly still gets a student, the best its SFT made.

With the SFT command after ``--`` (``... --out seed0/student/warm.pth -- python opd/sft.py ...``), it runs that SFT
itself, measures each kept checkpoint as soon as it is written, and stops the SFT (SIGTERM) at the first that
reaches the threshold: the same pick, without training the steps after it.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from common.atomic_write import atomic_write_json
from common.chat_records import load_agent_records
from common.generation.sampler import TokenSampler
from common.minimind.model import load_model
from experiments.study.divergence import model_spec
from experiments.weights import copy_weights
from opd.config import RolloutConfig, SamplingConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.scoring import score_episode
from opd.rollouts.rollout import AgentRollout

BATCH = 64
POLL_S = 1.0  # how often a followed SFT's folder is looked at for a new kept checkpoint


def kept_checkpoints(run_dir: Path, stem: str) -> list[tuple[int, Path]]:
    """(step, path) of every ``{stem}_step{N}.pth`` in ``run_dir``, in step order."""
    return _kept(run_dir, re.escape(stem))


def _kept(run_dir: Path, stem_pattern: str) -> list[tuple[int, Path]]:
    pattern = re.compile(rf"{stem_pattern}_step(\d+)\.pth")
    found = [(int(match.group(1)), path) for path in run_dir.iterdir() if (match := pattern.fullmatch(path.name))]
    return sorted(found)


def greedy_accuracy(model, chat_format: ChatFormat, records, limits: RolloutConfig) -> float:
    """The share of ``records`` a greedy rollout of ``model`` answers correctly."""
    rollout = AgentRollout(model, chat_format, TokenSampler(SamplingConfig(temperature=0.0), "cpu", 0), limits)
    correct = 0
    for start in range(0, len(records), BATCH):
        correct += sum(score_episode(episode, chat_format).correct
                       for episode in rollout.run(records[start:start + BATCH]))
    return correct / len(records)


def followed_checkpoints(run_dir: Path, stem: str, command: list[str]):
    """Run the SFT ``command`` and yield (step, path) of each checkpoint it keeps, in step order, as it is written;
    the SFT is stopped when the caller stops asking (``close``). Raises ``RuntimeError`` when the SFT fails, or when
    it keeps step weights under another stem than ``stem`` (none would ever be measured). Kept files older than this
    SFT (an earlier run's, which ``overwrite=true`` replaces only step by step) are not its."""
    started = time.time()
    child, seen = subprocess.Popen(command), 0
    try:
        while True:
            finished = child.poll() is not None  # looked at before the folder: no checkpoint can be missed
            for step, path in kept_checkpoints(run_dir, stem) if run_dir.is_dir() else []:
                if step > seen and path.stat().st_mtime >= started:
                    seen = step
                    yield step, path
            if not seen and run_dir.is_dir():
                ours = re.compile(rf"{re.escape(stem)}_step\d+\.pth")  # one listing below: a checkpoint of ours
                others = [path.name for _, path in _kept(run_dir, r"\w+")  # written meanwhile is not another's
                          if not ours.fullmatch(path.name) and path.stat().st_mtime >= started]
                if others:
                    raise RuntimeError(f"the SFT keeps {others[0]} in {run_dir}, not {stem}_step<N>.pth: --stem must "
                                       f"be the stem of its weights")
            if finished:
                if child.returncode:
                    raise RuntimeError(f"the SFT ({' '.join(command[:2])} ...) exited with status {child.returncode}")
                return
            time.sleep(POLL_S)
    finally:
        if child.poll() is None:
            child.terminate()
            child.wait()
            print(f"stopped the SFT at its pick (step {seen} kept last)", flush=True)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[argv.index("--") + 1:] if "--" in argv else None
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s [options] [-- SFT command to run and stop at the pick]")
    parser.add_argument("--run-dir", required=True, type=Path, help="the SFT run's out_dir (its kept step weights)")
    parser.add_argument("--stem", required=True, help="the weights' stem, e.g. student_warm_64")
    parser.add_argument("--arch", required=True, help="hidden_size,layers,heads,kv_heads")
    parser.add_argument("--data", required=True, help="validation prompts with gt (not the held-out split)")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--prompts", type=int, default=120)
    parser.add_argument("--min-accuracy", type=float, required=True)
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--max-gen-len", type=int, default=64)
    parser.add_argument("--max-total-len", type=int, default=1024)
    parser.add_argument("--out", required=True, type=Path, help="where the chosen weights are copied (.pth, or .safetensors)")
    parser.add_argument("--role", default="student", help="the study's block the SFT belongs to (named in errors)")
    parser.add_argument("--best-if-none", action="store_true",
                        help="when no checkpoint reaches --min-accuracy, pick the best one instead of failing")
    args = parser.parse_args(argv)
    records = load_agent_records(args.data)[0][:args.prompts]
    limits = RolloutConfig(args.max_turns, args.max_gen_len, args.max_total_len, False)
    measured, chosen = [], None
    signal.signal(signal.SIGTERM, _interrupt)  # a terminated pick stops the SFT it runs (the finally below)
    checkpoints = (followed_checkpoints(args.run_dir, args.stem, command) if command
                   else iter(kept_checkpoints(args.run_dir, args.stem)))
    try:
        for step, path in checkpoints:
            torch.manual_seed(0)
            model, tokenizer = load_model(model_spec(str(path), args.arch, args.tokenizer, "student"), role="student")
            accuracy = greedy_accuracy(model.eval(), ChatFormat(tokenizer), records, limits)
            measured.append({"step": step, "checkpoint": str(path), "accuracy": accuracy})
            print(f"step {step}: validation accuracy {accuracy:.3f}", flush=True)
            if accuracy >= args.min_accuracy:
                chosen = measured[-1]
                break
    except RuntimeError as error:
        sys.exit(f"error: {error}; see its lines above")
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (_interrupt): the SFT is stopped below, then one error line
        print("error: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if command:
            checkpoints.close()
    reached = chosen is not None
    best = max(measured, key=lambda row: row["accuracy"], default=None)  # max keeps the first (earliest) of equals
    if not reached and args.best_if_none and best is not None:
        chosen = best
        print(f"no checkpoint reached validation accuracy {args.min_accuracy}: picked the best, step {best['step']} "
              f"({best['accuracy']:.3f})", flush=True)
    report = {"min_accuracy": args.min_accuracy, "prompts": len(records), "measured": measured, "chosen": chosen,
              "reached": reached}
    atomic_write_json(args.out.with_suffix(".json"), report)
    if chosen is None:
        sys.exit(f"error: no SFT checkpoint in {args.run_dir} reached validation accuracy {args.min_accuracy} "
                 f"(best: {best}); train the {args.role} longer ({args.role}.sft_steps)")
    if args.out.suffix == ".safetensors":  # the study's run folder keeps the same tensors as safetensors
        copy_weights(Path(chosen["checkpoint"]), args.out)
    else:
        temporary = args.out.with_name(args.out.name + ".tmp")
        shutil.copyfile(chosen["checkpoint"], temporary)
        temporary.replace(args.out)


if __name__ == "__main__":
    main()
