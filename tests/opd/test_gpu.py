"""On a CUDA device (marker ``gpu``, excluded from ``make test``; ``make gpu-check`` runs them): bf16 autocast
training with fp32 loss logits, and the 768x8 pair's OPD step."""

from __future__ import annotations

import pytest
import torch

from opd.episodes.episode import pack_episodes
from opd.training.loss import logits_at_targets
from tests.helpers.opd_support import TINY_STUDENT, agent_record, tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_loss_logits_are_fp32_under_bf16_autocast_on_cuda(tokenizer):
    from opd.episodes.chat_format import ChatFormat
    from opd.episodes.episode import Episode, Turn

    chat_format = ChatFormat(tokenizer)
    record = agent_record("g.jsonl:1", "What is 2+3?")
    ids = chat_format.prompt_ids(record) + [tokenizer.eos_token_id]
    episode = Episode(record, len(ids) - 1, ids, [Turn(len(ids) - 1, len(ids))])
    batch = pack_episodes([episode, episode], tokenizer.pad_token_id).to("cuda")
    model = tiny_model(TINY_STUDENT).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits, _ = logits_at_targets(model, batch)
        plain = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    assert plain.dtype == torch.bfloat16 and logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_opd_steps_of_the_768_pair_in_bf16(tmp_path, tokenizer_path):
    from benchmarks.gpu_check import main

    results = main(["--batch-sizes", "8", "--steps", "2", "--tokenizer", str(tokenizer_path),
                    "--out", str(tmp_path / "gpu.json")])
    (run,) = results["runs"]
    assert run["step_tokens_per_s"] > 0 and run["peak_gpu_memory_gib"] > 0 and results["dtype"] == "bfloat16"
