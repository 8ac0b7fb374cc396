"""vLLM's ``/v1/completions`` with ``prompt_logprobs``, answered by a real model in this process.

A responder for ``standins.vllm_server.StandinServer(completions=...)``: for a token-id ``prompt`` it returns, as
vLLM 0.32 does, ``choices[0].prompt_logprobs``: None for the first position, then per position the top
``prompt_logprobs`` ids with their log-probabilities at temperature 1 plus the prompt's own id (-inf sent as -9999).
Faults to script: ``drop_prompt_id`` (a reply without the prompt's own id, as another tokenizer would give).
"""

from __future__ import annotations

import math

import torch

from standins.vllm_server import Reply


class PromptLogprobs:
    """Scores prompts with ``model`` (a transformers causal LM); ``calls`` counts the requests."""

    def __init__(self, model: torch.nn.Module, *, drop_prompt_id: bool = False, forged: float | None = None):
        """``forged``: every log-probability answered is this value instead (0.0: no distribution; -1e39: -inf in
        float32), as a hostile or broken server might."""
        self.model = model.eval()
        self.drop_prompt_id, self.forged = drop_prompt_id, forged
        self.calls = 0

    def __call__(self, payload: dict) -> Reply:
        self.calls += 1
        ids, k = payload.get("prompt"), payload.get("prompt_logprobs")
        if not isinstance(ids, list) or not isinstance(k, int):
            return Reply({"error": {"message": "prompt must be token ids and prompt_logprobs an integer"}}, status=400)
        with torch.no_grad():
            logprobs = torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), dim=-1)
        rows = [None]
        for position in range(1, len(ids)):
            row = logprobs[position - 1]
            top = torch.topk(row, min(k, row.shape[0]))
            entries = {int(i): float(v) for v, i in zip(top.values, top.indices, strict=True)}
            if self.drop_prompt_id:
                entries.pop(ids[position], None)
            else:
                entries[ids[position]] = float(row[ids[position]])
            rows.append({str(i): {"logprob": self.forged if self.forged is not None else v if math.isfinite(v)
                                  else -9999.0, "rank": 1, "decoded_token": "x"} for i, v in entries.items()})
        return Reply({"id": "cmpl-standin", "object": "text_completion", "model": payload.get("model"),
                      "choices": [{"index": 0, "text": "x", "logprobs": None, "finish_reason": "length",
                                   "prompt_logprobs": rows}],
                      "usage": {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}})
