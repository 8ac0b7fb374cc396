"""Held-out evaluation of several MiniMind checkpoints with identical decoding, tool limits and seed.

    python opd/evaluate.py data=heldout.jsonl tokenizer=PATH \
        'models={student: {checkpoint: out/full_sft_768.pth, hidden_size: 768, num_hidden_layers: 8}}' \
        +model@models.teacher=agent_768

Each checkpoint rolls out ``samples_per_prompt`` episodes per record through the trainer's rollout, sample j seeded
by (seed, the record's prompt, j) so an episode depends on neither batches nor order; ``opd.episodes.scoring`` scores
them. On CPU each checkpoint runs in a fresh process (``isolate=true``) so its peak RSS is its own. Settings:
``configs/evaluate.yaml``.
"""

from __future__ import annotations

if __name__ == "__main__":  # the script: the imports below happen once, inside the command's start-up (opd.commands)
    try:
        from opd.commands import run
    except ModuleNotFoundError:  # a Python without the project (not the venv's): one line, no traceback
        raise SystemExit("error: this Python has no onpolicy-research: use the venv's (make setup, then source .venv/bin/activate)") from None

    run("evaluate")
    raise SystemExit

import json
import multiprocessing
import resource
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

from common.atomic_write import atomic_write_json, atomic_write_text
from common.chat_records import AgentRecord, RecordError, load_agent_records
from common.minimind.model import load_model
from common.minimind.spec import ModelSpec, is_native_checkpoint
from common.minimind.tokenizer import check_same_tokenizer, load_tokenizer
from common.run_folders import checks_passed
from common.run_log import progress_bar, show
from common.stop_signals import held
from common.user_errors import UserError
from opd.config import EvalConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.scoring import aggregate, expected_outcomes, score_episode
from opd.reports.charts import chart_pyplot, write_chart
from opd.reports.tables import print_table
from opd.rollouts.rollout import AgentRollout
from opd.rollouts.sampling import record_sampler, sample_seed
from opd.training.checkpoints import vocabulary_fingerprint
from opd.training.metric_loggers import MetricLoggers
from opd.training.train_log import run_dir_of

MIB = 1 << 20



def evaluate(cfg: EvalConfig) -> dict:
    """Evaluate every model of ``cfg.models`` on ``cfg.data``; prints the table, writes JSON (and the chart, where
    matplotlib is installed: else one warning line)."""
    chart = cfg.chart and chart_pyplot("evaluation.png", turn_off=", or set chart=false") is not None
    records, data_sha256 = load_agent_records(cfg.data)
    check_heldout(records, cfg)
    checks_passed()  # data and tokenizers are checked: from here on a failure keeps the run's folders
    out = Path(cfg.out_dir)
    results = []
    for name, spec in cfg.models.items():
        evaluate_one = evaluate_isolated if cfg.isolate else evaluate_checkpoint
        results.append(evaluate_one(name, spec, cfg))
    report = {"data": str(cfg.data), "data_sha256": data_sha256, "records": len(records),
              "settings": {"sampling": asdict(cfg.sampling), "rollout": asdict(cfg.rollout), "seed": cfg.seed,
                           "samples_per_prompt": cfg.samples_per_prompt, "batch_size": cfg.batch_size, "device": str(cfg.precision.device), "isolate": cfg.isolate},
              "checkpoints": results, "json": str(out / "evaluation.json"),
              "chart": str(out / "evaluation.png") if chart else None}
    with MetricLoggers(cfg.logger, run_dir_of(cfg.out_dir), config=asdict(cfg)) as loggers:
        for result in results:
            loggers.log({"step": cfg.log_step, **result}, step=cfg.log_step, prefix=f"eval/{result['name']}")
    print_table(results)
    atomic_write_json(out / "evaluation.json", report)
    if chart:
        write_chart(results, out / "evaluation.png")
    show(f"wrote {report['json']}" + (f" and {report['chart']}" if chart else ""))
    return report


def check_heldout(records: list[AgentRecord], cfg: EvalConfig) -> None:
    """Before any rollout: every checkpoint exists, every record has ``gt``, runnable ``expected_calls`` and fits the
    limits, and every model uses the same tokenizer."""
    for name, spec in cfg.models.items():
        if spec.checkpoint and is_native_checkpoint(spec.checkpoint) and not Path(spec.checkpoint).is_file():
            raise UserError(f"models.{name}.checkpoint: no such file: {spec.checkpoint}")
    for record in records:
        if not record.gt:
            raise RecordError(f"{record.source}: gt is required for evaluation (the strings a correct answer contains)")
        expected_outcomes(record)
    tokenizers = {name: load_tokenizer(spec.tokenizer or spec.checkpoint, role=f"models.{name}.tokenizer")
                  for name, spec in cfg.models.items()}
    first = next(iter(tokenizers))
    for name, tokenizer in tokenizers.items():
        check_same_tokenizer(tokenizers[first], tokenizer, first, name)
    chat_format = ChatFormat(tokenizers[first], open_thinking=cfg.rollout.open_thinking)
    for record in records:
        chat_format.prompt_ids(record, cfg.rollout.max_total_len)


def _rss_mb() -> float:
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * resource.getpagesize() / MIB


def _episode_row(score, episode, sample: int, chat_format: ChatFormat) -> dict:
    return {**asdict(score), "sample": sample, "gt": episode.record.gt,
            "turn_texts": [chat_format.tokenizer.decode(episode.turn_ids(i)) for i in range(len(episode.turns))]}


def evaluate_checkpoint(name: str, spec: ModelSpec, cfg: EvalConfig, *, isolated: bool = False) -> dict:
    """Roll out every held-out record ``samples_per_prompt`` times with one checkpoint and score it; writes
    ``episodes_{name}.jsonl`` (record by record, each record's samples in order)."""
    precision = cfg.precision
    baseline_rss = _rss_mb()
    cuda = precision.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(precision.device)
    started = time.perf_counter()
    model, tokenizer = load_model(spec, role=f"models.{name}")
    model.to(precision.device).eval()
    loaded = time.perf_counter()
    records, _ = load_agent_records(cfg.data)
    torch.manual_seed(cfg.seed)
    chat_format = ChatFormat(tokenizer, open_thinking=cfg.rollout.open_thinking)
    seed = cfg.sampling.seed_or(cfg.seed)
    done = {}  # (record index, sample) -> (score, episode)
    progress = progress_bar(f"eval {name}", "accuracy {task.fields[accuracy]}")  # episodes done of total, ETA
    with progress:
        task = progress.add_task("episodes", total=len(records) * cfg.samples_per_prompt, accuracy="-")
        for sample in range(cfg.samples_per_prompt):  # a batch never holds one record twice (generators by source)
            for start in range(0, len(records), cfg.batch_size):
                chunk = records[start:start + cfg.batch_size]
                sampler = record_sampler(cfg.sampling, precision.device,
                                         {record.source: sample_seed(seed, record, sample) for record in chunk})
                batch = AgentRollout(model, chat_format, sampler, cfg.rollout, autocast=precision.autocast).run(chunk)
                for index, episode in enumerate(batch, start):
                    done[index, sample] = score_episode(episode, chat_format), episode
                accuracy = sum(score.correct for score, _ in done.values()) / len(done)
                progress.update(task, advance=len(batch), accuracy=f"{accuracy:.3f}")
    wall = time.perf_counter() - loaded
    scores = [done[key][0] for key in sorted(done)]
    rows = "".join(json.dumps(_episode_row(*done[key], key[1], chat_format), ensure_ascii=False) + "\n"
                   for key in sorted(done))
    atomic_write_text(Path(cfg.out_dir) / f"episodes_{name}.jsonl", rows)
    if cuda:
        peak, kind = torch.cuda.max_memory_allocated(precision.device) / MIB, "cuda_max_allocated"
    elif isolated:
        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process_peak_rss"
    else:
        peak, kind = None, "not measured (cpu, isolate=false)"
    return {"name": name, "checkpoint": str(spec.checkpoint), **aggregate(scores), "load_s": loaded - started,
            "wall_s": wall, "assistant_tokens_per_s": sum(s.assistant_tokens for s in scores) / wall,
            "peak_memory_mb": peak, "peak_memory_kind": kind, "baseline_rss_mb": baseline_rss,
            "vocab_sha256": vocabulary_fingerprint(tokenizer)}


def _child(connection, name: str, spec: ModelSpec, cfg: EvalConfig) -> None:
    try:
        connection.send(("ok", evaluate_checkpoint(name, spec, cfg, isolated=True)))
    except (UserError, FileNotFoundError) as error:
        connection.send(("user_error", str(error)))
    except BaseException:  # report anything, including KeyboardInterrupt, to the parent
        connection.send(("error", traceback.format_exc()))
    finally:
        connection.close()


def evaluate_isolated(name: str, spec: ModelSpec, cfg: EvalConfig) -> dict:
    """``evaluate_checkpoint`` in a fresh spawned process (its peak RSS is this checkpoint's alone)."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, name, spec, cfg), daemon=True)
    with held():  # a signal now would leave the child half-started, printing a traceback
        process.start()
    sender.close()
    try:
        status, payload = receiver.recv()
    except EOFError:
        process.join()
        raise RuntimeError(f"evaluating {name} ({spec.checkpoint}): the worker process died "
                           f"(exit code {process.exitcode}; out of memory?)") from None
    finally:
        receiver.close()
    process.join()
    if status == "user_error":
        raise UserError(payload)
    if status != "ok":
        raise RuntimeError(f"evaluating {name} ({spec.checkpoint}) failed in its worker process:\n{payload}")
    return payload

