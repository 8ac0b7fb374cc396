"""Teacher rollouts generated once with the trainer's rollout engine and cached for the fixed-data baseline.

One JSONL file per producer, named by a hash of everything that determines the episodes; line 1 is a header with
that key, each other line one episode, appended a batch at a time and flushed. Runs reuse cached episodes and generate
only the missing ones; a torn last line is cut off. Each record samples from a generator seeded by (seed, record index).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch

from common.chat_records import AgentRecord
from common.run_log import progress_bar
from opd.config import OPDConfig, RolloutConfig, SamplingConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.episode import STOP_REASONS, Episode, Turn
from opd.rollouts.rollout import AgentRollout
from opd.rollouts.sampling import derived_seed, record_sampler
from opd.training.distributed import Ranks
from tools.tool_environment import CallOutcome

CACHE_FORMAT = "opd-teacher-rollouts/1"


def episode_to_json(index: int, episode: Episode) -> dict:
    """One cache line: the record index and everything needed to rebuild the episode."""
    return {"index": index, "source": episode.record.source, "prompt_length": episode.prompt_length,
            "ids": episode.ids, "stop_reason": episode.stop_reason,
            "turns": [{"start": t.start, "end": t.end, "observation_end": t.observation_end,
                       "calls": [[c.name, c.status, c.detail] for c in t.calls]} for t in episode.turns]}


def episode_from_json(line: dict, record: AgentRecord) -> Episode:
    """Rebuild a cached episode for ``record`` (tool results themselves are not kept, only their status)."""
    turns = [Turn(t["start"], t["end"], [CallOutcome(name, status, detail) for name, status, detail in t["calls"]],
                  t["observation_end"]) for t in line["turns"]]
    if line["stop_reason"] not in STOP_REASONS or not turns or turns[-1].end != len(line["ids"]):
        raise ValueError("inconsistent episode")
    episode = Episode(record, line["prompt_length"], line["ids"], turns, stop_reason=line["stop_reason"])
    episode.teacher_written = [True] * episode.assistant_tokens
    return episode


class TeacherRolloutCache:
    """The cache file of one producer ``key`` for the records of one data file."""

    def __init__(self, cache_dir: str | Path, data_path: str | Path, key: dict) -> None:
        self.key = key
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        self.path = Path(cache_dir) / f"{Path(data_path).stem}_{digest}.jsonl"

    def load(self, records: list[AgentRecord]) -> dict[int, Episode]:
        """Episodes already cached, by record index; cuts a torn last line; refuses a file of another producer."""
        if not self.path.is_file():
            return {}
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        if raw and not raw.endswith(b"\n"):  # a crash mid-write: drop the partial line
            self._truncate(len(raw) - len(lines[-1]))
        lines = [line for line in lines[:-1] if line.strip()]
        if not lines:  # nothing complete was ever written
            self.path.unlink()
            return {}
        try:
            header = json.loads(lines[0]) if lines else None
        except json.JSONDecodeError:
            header = None
        if not header or header.get("format") != CACHE_FORMAT or header.get("key") != self.key:
            raise ValueError(f"{self.path}: not a teacher-rollout cache for these settings (header "
                             f"{lines[0][:200]!r}); delete it or pick another offline.cache_dir")
        episodes = {}
        for number, line in enumerate(lines[1:], start=2):
            try:
                row = json.loads(line)
                episodes[row["index"]] = episode_from_json(row, records[row["index"]])
            except (ValueError, KeyError, IndexError, TypeError) as error:
                raise ValueError(f"{self.path}:{number}: unreadable cached episode ({error}); delete the cache "
                                 "file to regenerate it") from None
        return episodes

    def _truncate(self, size: int) -> None:
        with self.path.open("r+b") as stream:
            stream.truncate(size)

    def append(self, items: list[tuple[int, Episode]]) -> None:
        """Append finished episodes as whole lines in one write, flushed to disk (header first if new)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists()
        text = json.dumps({"format": CACHE_FORMAT, "key": self.key}) + "\n" if new else ""
        text += "".join(json.dumps(episode_to_json(index, episode)) + "\n" for index, episode in items)
        with self.path.open("a", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())


def teacher_episodes(cache: TeacherRolloutCache, records: list[AgentRecord], needed: list[int], *,
                     teacher: torch.nn.Module, chat_format: ChatFormat, sampling: SamplingConfig, seed: int,
                     limits: RolloutConfig, batch_size: int, device: torch.device,
                     autocast: Callable[[], AbstractContextManager] = nullcontext) -> dict[int, Episode]:
    """Episodes of the ``needed`` record indices: cached ones reused, the rest rolled out by the teacher and cached."""
    episodes = cache.load(records)
    missing = sorted(set(needed) - episodes.keys())
    if not missing:
        return episodes
    base_seed = sampling.seed_or(seed)
    progress = progress_bar("teacher rollouts", "")  # done of total, the time so far and the ETA
    with progress:
        task = progress.add_task("rollouts", total=len(missing))
        for start in range(0, len(missing), batch_size):
            chunk = missing[start:start + batch_size]
            sampler = record_sampler(sampling, device, {records[i].source: derived_seed(base_seed, i) for i in chunk})
            rolled = AgentRollout(teacher, chat_format, sampler, limits, autocast=autocast, teacher_model=True).run(
                [records[i] for i in chunk])
            cache.append(list(zip(chunk, rolled, strict=True)))
            episodes.update(zip(chunk, rolled, strict=True))
            progress.advance(task, len(chunk))
    return episodes


def rollout_cache_key(signature: dict, device: torch.device) -> dict:
    """What determines the teacher's episodes: from the run signature (data, teacher, tokenizer, dtype, seed,
    sampling, rollout limits) plus the device type."""
    shared = ("data.sha256", "tokenizer.vocab_sha256", "dtype", "seed")
    key = {name: value for name, value in signature.items()
           if name in shared or name.startswith(("teacher.", "sampling.", "rollout."))}
    key["device_type"] = device.type
    return key


def cached_teacher_episodes(cfg: OPDConfig, records: list[AgentRecord], needed: list[int], teacher: torch.nn.Module,
                            chat_format: ChatFormat, signature: dict, ranks: Ranks,
                            device: torch.device) -> dict[int, Episode]:
    """A training run's teacher episodes of the ``needed`` records (``teacher_episodes``): rank 0 rolls out what the
    cache lacks and caches it, then every other rank reads the cache."""
    cache = TeacherRolloutCache(cfg.offline.cache_dir, cfg.data, rollout_cache_key(signature, device))

    def episodes() -> dict[int, Episode]:
        return teacher_episodes(cache, records, needed, teacher=teacher, chat_format=chat_format, sampling=cfg.sampling,
                                seed=cfg.seed, limits=cfg.rollout, batch_size=cfg.batch_size, device=device,
                                autocast=cfg.precision.autocast)

    result = episodes() if ranks.is_main else None
    ranks.barrier()
    return result if ranks.is_main else episodes()
