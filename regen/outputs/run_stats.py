"""What happened in one regen run: its counters, its first failure and why it stopped early (if it did)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RunStats:
    """What happened to every source record this run (each lands in exactly one outcome counter)."""

    done: int = 0
    failed: int = 0
    input_errors: int = 0  # unusable rows, duplicate ids included
    duplicate_ids: int = 0
    skipped_done: int = 0
    skipped_language: int = 0
    rows: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_corrected: int = 0  # history turns whose split regen took from the token ids, not the parser
    other_model_replies: int = 0  # replies naming another model than the requests
    truncated: Counter = field(default_factory=Counter)
    retries: int = 0  # requests sent again, over all conversations
    retry_wait_s: float = 0.0  # time spent backing off before them
    first_failure: str | None = None  # "WHERE: error" of the first error-file row this run
    recovered_ids: set[str] = field(default_factory=set)  # in the error file at the start, written this run
    tokenizer_warning: str | None = None
    stopped: str | None = None  # why reading stopped before the end of the source
    started: float = field(default_factory=time.monotonic)

    @property
    def handled(self) -> int:
        """Source records dealt with (the ones ``limit`` counts: everything past the language filter)."""
        return self.done + self.failed + self.input_errors + self.skipped_done

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def rate(self, count: float) -> float:
        elapsed = self.elapsed_s
        return count / elapsed if elapsed > 0 else 0.0

    def summary(self, requests: int) -> dict:
        """The counts and rates of this run (``regen.outputs.run_summary`` adds files, endpoints and settings)."""
        return {
            "conversations_done": self.done,
            "conversations_truncated": sum(self.truncated.values()),
            "truncated_by_reason": dict(self.truncated),
            "conversations_failed": self.failed,
            "input_errors": self.input_errors,
            "duplicate_ids": self.duplicate_ids,
            "skipped_already_done": self.skipped_done,
            "skipped_language": self.skipped_language,
            "rows_written": self.rows,
            "requests": requests,
            "retries": self.retries,
            "retry_wait_s": round(self.retry_wait_s, 3),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "reasoning_split_corrected": self.reasoning_corrected,
            "replies_naming_other_models": self.other_model_replies,
            "elapsed_s": round(self.elapsed_s, 3),
            "conversations_per_s": round(self.rate(self.done + self.failed), 3),
            "requests_per_s": round(self.rate(requests), 3),
            "completion_tokens_per_s": round(self.rate(self.completion_tokens), 1),
        }
