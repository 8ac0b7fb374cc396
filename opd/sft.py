"""Supervised fine-tuning of a MiniMind model on tool-use demonstrations (e.g. to build a teacher).

    python opd/sft.py data=demonstrations.jsonl model=full_sft_768
    python opd/sft.py data=demonstrations.jsonl from_scratch=true model.hidden_size=256 model.num_hidden_layers=4

Demonstrations become fixed sequences as in ``opd.episodes.demonstrations``; each optimizer step minimizes the mean
cross-entropy over its window's target tokens (plus a MoE router loss), on ``opd.training.loop``'s loop (data order,
schedule, resume, checkpoints as ``opd/train.py``). Settings: ``configs/sft.yaml``.
"""

from __future__ import annotations

if __name__ == "__main__":  # the script: the imports below happen once, inside the command's start-up (opd.commands)
    try:
        from opd.commands import run
    except ModuleNotFoundError:  # a Python without the project (not the venv's): one line, no traceback
        raise SystemExit("error: this Python has no onpolicy-research: use the venv's (make setup, then source .venv/bin/activate)") from None

    run("sft")
    raise SystemExit

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from opd.config import SFTConfig
from opd.episodes.chat_format import ChatFormat
from opd.episodes.demonstrations import fitting_episodes, load_demonstrations, tokenizing_processes
from opd.episodes.episode import Episode
from opd.training.checkpoints import file_fingerprint, vocabulary_fingerprint
from opd.training.data_order import Window
from opd.training.distributed import Ranks
from opd.training.loop import Recipe, TrainingRun
from opd.training.loss import sft_loss_step
from opd.training.model_loading import initial_model


def train(cfg: SFTConfig) -> dict:
    """Fine-tune ``cfg.model`` on ``cfg.data`` (continuing ``cfg.resume``); returns the summary. Under ``torchrun``
    each process trains on its share of each global micro-batch."""
    run = TrainingRun(cfg)
    # --- data and model, checked before any compute
    demonstrations, data_sha256 = load_demonstrations(cfg.data)
    model, tokenizer = initial_model(cfg)
    torch.manual_seed(cfg.seed)
    chat_format = ChatFormat(tokenizer, open_thinking=cfg.open_thinking)
    _, episodes = fitting_episodes(demonstrations, chat_format, cfg.max_total_len, drop_too_long=cfg.drop_too_long,
                                   shown=run.ranks.is_main, processes=tokenizing_processes(cfg.dataset_num_proc))
    order = run.data_order(len(episodes))
    signature = run.signature(
        order, cfg.recipe_settings(), models={"model": model},
        fingerprints={"data.sha256": data_sha256, "tokenizer.vocab_sha256": vocabulary_fingerprint(tokenizer),
                      "model.init": f"scratch:seed={cfg.seed}" if cfg.from_scratch
                      else file_fingerprint(cfg.model.checkpoint)})
    run.claim(model, cfg.save_prefix, signature)
    return run.fit(model, order, FineTuning(cfg, run.ranks, chat_format, episodes),
                   summary={"architecture": asdict(cfg.model.arch)})


@dataclass
class FineTuning(Recipe):
    """SFT's step: this rank's share of each micro-batch's demonstrations, cross-entropy at their targets."""

    name = "sft"
    loss_name = "cross_entropy"
    cfg: SFTConfig
    ranks: Ranks
    chat_format: ChatFormat
    episodes: list[Episode]

    def collect(self, window: Window, stop: Callable[[], bool]) -> list[list[Episode]]:
        return [[self.episodes[i] for i in self.ranks.share(batch)] for batch in window.batches]

    def loss(self, forward: torch.nn.Module, episodes: list[Episode], batch):
        return sft_loss_step(forward, episodes, batch, self.cfg.precision,
                             share_prefix=not self.cfg.gradient_checkpointing)

