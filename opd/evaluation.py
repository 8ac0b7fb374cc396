"""Held-out evaluation of several checkpoints with identical decoding, tool limits and seed.

Every checkpoint rolls out the same held-out records in the same batches through the trainer's own
batched rollout and mock-tool environment (``opd.rollout``), with one ``sampling`` setting (greedy by
default), one set of limits and a sampler seeded with the same ``seed``. Episodes are scored by
``opd.episode_metrics``; each checkpoint's episodes go to ``episodes_{name}.jsonl`` for inspection.

Time and memory per checkpoint: ``load_s`` (reading the weights) and ``wall_s`` (all rollouts) are wall
clock. Peak memory on CUDA is ``torch.cuda.max_memory_allocated`` since the checkpoint's start. On CPU each
checkpoint runs in its own fresh process (``isolate=true``) and the figure is that process's peak resident
set size (``getrusage`` ``ru_maxrss``), which also holds the interpreter and libraries: ``baseline_rss_mb``
(the process's RSS before the model is loaded) is reported beside it. With ``isolate=false`` on CPU the
peak is not measured (a process-lifetime maximum would mix checkpoints).
"""

from __future__ import annotations

import json
import multiprocessing
import re
import resource
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from opd.agent_records import AgentRecord, RecordError, load_agent_records
from opd.atomic_write import atomic_write_json, atomic_write_text
from opd.chat_format import ChatFormat
from opd.checkpoints import vocabulary_fingerprint
from opd.episode_metrics import aggregate, score_episode
from opd.eval_report import print_table, require_matplotlib, write_chart
from opd.minimind.model import load_model
from opd.minimind.precision import resolve_precision
from opd.minimind.tokenizer import check_same_tokenizer, load_tokenizer
from opd.rollout import AgentRollout, RolloutLimits
from opd.sampling import SamplingSettings, TokenSampler

NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
MIB = 1 << 20


@dataclass(frozen=True)
class EvalSettings:
    """What every checkpoint is evaluated with."""

    sampling: SamplingSettings
    limits: RolloutLimits
    seed: int
    batch_size: int
    open_thinking: bool
    device: str
    dtype: str


def settings_from_config(cfg: DictConfig) -> EvalSettings:
    """Validated evaluation settings (sampling, limits, batch size) from the config."""
    if not isinstance(cfg.batch_size, int) or cfg.batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {cfg.batch_size!r}")
    limits = RolloutLimits(cfg.max_turns, cfg.max_gen_len, cfg.max_total_len)
    return EvalSettings(SamplingSettings.from_config(cfg.sampling), limits, cfg.seed, cfg.batch_size,
                        cfg.open_thinking, cfg.device, cfg.dtype)


def model_blocks(cfg: DictConfig) -> dict[str, dict]:
    """``cfg.models`` as plain dicts, each with a tokenizer (the top-level one unless it sets its own)."""
    if not cfg.models:
        raise ValueError("models is empty: give name -> model block (checkpoint and architecture flags)")
    blocks = {}
    for name, block in cfg.models.items():
        if not NAME.match(str(name)):
            raise ValueError(f"models.{name}: a name may only use letters, digits, '_', '-' and '.'")
        if not isinstance(block, DictConfig) or not block.get("checkpoint"):
            raise ValueError(f"models.{name}: expected a model block with a checkpoint")
        plain = OmegaConf.to_container(block, resolve=True)
        plain["tokenizer"] = plain.get("tokenizer") or cfg.tokenizer
        blocks[str(name)] = plain
    return blocks


def check_heldout(records: list[AgentRecord], blocks: dict[str, dict], settings: EvalSettings) -> None:
    """Every record has ``gt`` and fits the limits; every model uses the same tokenizer (fails before any rollout)."""
    for record in records:
        if not record.gt:
            raise RecordError(f"{record.source}: gt is required for evaluation (the strings a correct answer contains)")
    tokenizers = {name: load_tokenizer(block["tokenizer"] or block["checkpoint"], role=f"models.{name}.tokenizer")
                  for name, block in blocks.items()}
    first = next(iter(tokenizers))
    for name, tokenizer in tokenizers.items():
        check_same_tokenizer(tokenizers[first], tokenizer, first, name)
    chat_format = ChatFormat(tokenizers[first], open_thinking=settings.open_thinking)
    for record in records:
        chat_format.prompt_ids(record, settings.limits.max_total_len)


def _rss_mb() -> float:
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * resource.getpagesize() / MIB


def _episode_row(score, episode, chat_format: ChatFormat) -> dict:
    return {**asdict(score), "gt": episode.record.gt,
            "turn_texts": [chat_format.tokenizer.decode(episode.turn_ids(i)) for i in range(len(episode.turns))]}


def evaluate_checkpoint(name: str, block: dict, data: str, settings: EvalSettings, out_dir: str | Path, *,
                        isolated: bool = False) -> dict:
    """Roll out every held-out record with one checkpoint and score it; writes ``episodes_{name}.jsonl``."""
    precision = resolve_precision(settings.device, settings.dtype)
    baseline_rss = _rss_mb()
    cuda = precision.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(precision.device)
    started = time.perf_counter()
    model, tokenizer = load_model(block, role=name)
    model.to(precision.device).eval()
    loaded = time.perf_counter()
    records, _ = load_agent_records(data)
    torch.manual_seed(settings.seed)
    chat_format = ChatFormat(tokenizer, open_thinking=settings.open_thinking)
    rollout = AgentRollout(model, chat_format, TokenSampler(settings.sampling, precision.device, settings.seed),
                           settings.limits, autocast=precision.autocast)
    episodes, scores = [], []
    progress = Progress(TextColumn(f"[bold]eval {name}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("accuracy {task.fields[accuracy]}"), TimeElapsedColumn())
    with progress:
        task = progress.add_task("records", total=len(records), accuracy="-")
        for start in range(0, len(records), settings.batch_size):
            batch = rollout.run(records[start:start + settings.batch_size])
            episodes += batch
            scores += [score_episode(episode, chat_format) for episode in batch]
            accuracy = sum(score.correct for score in scores) / len(scores)
            progress.update(task, advance=len(batch), accuracy=f"{accuracy:.3f}")
    wall = time.perf_counter() - loaded
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = "".join(json.dumps(_episode_row(s, e, chat_format), ensure_ascii=False) + "\n"
                   for s, e in zip(scores, episodes, strict=True))
    atomic_write_text(out / f"episodes_{name}.jsonl", rows)
    if cuda:
        peak, kind = torch.cuda.max_memory_allocated(precision.device) / MIB, "cuda_max_allocated"
    elif isolated:
        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process_peak_rss"
    else:
        peak, kind = None, "not measured (cpu, isolate=false)"
    metrics = aggregate(scores)
    return {"name": name, "checkpoint": str(block["checkpoint"]), **metrics, "load_s": loaded - started,
            "wall_s": wall, "assistant_tokens_per_s": sum(s.assistant_tokens for s in scores) / wall,
            "peak_memory_mb": peak, "peak_memory_kind": kind, "baseline_rss_mb": baseline_rss,
            "vocab_sha256": vocabulary_fingerprint(tokenizer)}


def _child(connection, name: str, block: dict, data: str, settings: EvalSettings, out_dir: str) -> None:
    try:
        connection.send(("ok", evaluate_checkpoint(name, block, data, settings, out_dir, isolated=True)))
    except BaseException:  # report anything, including KeyboardInterrupt, to the parent
        connection.send(("error", traceback.format_exc()))
    finally:
        connection.close()


def evaluate_isolated(name: str, block: dict, data: str, settings: EvalSettings, out_dir: str | Path) -> dict:
    """``evaluate_checkpoint`` in a fresh spawned process (its peak RSS is this checkpoint's alone)."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(sender, name, block, data, settings, str(out_dir)), daemon=True)
    process.start()
    sender.close()
    try:
        status, payload = receiver.recv()
    except EOFError:
        process.join()
        raise RuntimeError(f"evaluating {name} ({block['checkpoint']}): the worker process died "
                           f"(exit code {process.exitcode}; out of memory?)") from None
    finally:
        receiver.close()
    process.join()
    if status != "ok":
        raise RuntimeError(f"evaluating {name} ({block['checkpoint']}) failed in its worker process:\n{payload}")
    return payload


def run(cfg: DictConfig) -> dict:
    """Evaluate every model of ``cfg.models`` on ``cfg.data``; prints the table, writes JSON (and the chart)."""
    settings = settings_from_config(cfg)
    blocks = model_blocks(cfg)
    if cfg.chart:
        require_matplotlib()
    records, data_sha256 = load_agent_records(cfg.data)
    check_heldout(records, blocks, settings)
    out = Path(cfg.out_dir)
    results = []
    for name, block in blocks.items():
        evaluate = evaluate_isolated if cfg.isolate else evaluate_checkpoint
        results.append(evaluate(name, block, cfg.data, settings, out))
    report = {"data": str(cfg.data), "data_sha256": data_sha256, "records": len(records),
              "settings": {"sampling": asdict(settings.sampling), "limits": asdict(settings.limits), "seed": cfg.seed,
                           "batch_size": cfg.batch_size, "open_thinking": cfg.open_thinking,
                           "device": str(resolve_precision(cfg.device, cfg.dtype).device), "isolate": cfg.isolate},
              "checkpoints": results, "json": str(out / "evaluation.json"),
              "chart": str(out / "evaluation.png") if cfg.chart else None}
    print_table(results)
    atomic_write_json(out / "evaluation.json", report)
    if cfg.chart:
        write_chart(results, out / "evaluation.png")
    Console().print(f"wrote {report['json']}" + (f" and {report['chart']}" if cfg.chart else ""))
    return report
