"""The seeds of opd's sampling, and samplers whose rows are episodes.

The training rollout draws a batch from one run-seeded generator; cached teacher rollouts and evaluation draw each
episode from its record's own generator (``record_sampler``), so an episode depends neither on its batch nor on order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import torch

from common.chat_records import AgentRecord
from common.generation.sampler import SamplingSettings, TokenSampler
from opd.episodes.episode import Episode


def derived_seed(*parts) -> int:
    """A 63-bit seed from ``parts`` (their ``str``, joined by ``:``, hashed with sha256): the same parts, the same seed."""
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "big") >> 1


def prompt_key(record: AgentRecord) -> str:
    """A sha256 of the record's messages and tools (canonical JSON): the same prompt has the same key anywhere."""
    prompt = json.dumps([record.messages, record.tools], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(prompt.encode()).hexdigest()


def sample_seed(seed: int, record: AgentRecord, sample: int) -> int:
    """The seed of sample ``sample`` (0-based) of ``record`` in an evaluation sampling with ``seed``."""
    return derived_seed(seed, prompt_key(record), sample)


def _record_source(episode: Episode) -> str:
    return episode.record.source


def record_sampler(settings: SamplingSettings, device: torch.device | str, seeds: Mapping[str, int]) -> TokenSampler:
    """A sampler whose row for the episode of record ``source`` draws from a generator seeded with ``seeds[source]``."""
    return TokenSampler.per_row(settings, device, seeds, key=_record_source)
