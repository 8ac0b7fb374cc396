"""Continuous batching for the embedded server: many requests share every forward pass.

Generation is ``common.generation``'s; this adds continuous admission. One worker thread owns the model: at each
step boundary it prefills waiting requests (up to ``max_batch_size`` running, ``max_prefill_tokens`` per prefill),
merges them into the running batch and decodes one step; finished and cancelled sequences leave at the boundary.
No request can fail the others: when a shared pass fails, each sequence in it is rerun alone and only those that
fail alone get the error.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

import torch

from common.generation.decode_batch import DecodeBatch
from common.generation.sampler import GREEDY_EPS, Penalties, TokenSampler


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling (validated), with vLLM's meanings: temperature below ``GREEDY_EPS`` is greedy; ``top_k``
    0 or -1, ``top_p`` 1, ``min_p`` 0 are off. Each request has its own generator, so a seeded request gives the same
    tokens whatever shares its batch."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    @property
    def penalties(self) -> Penalties:
        return Penalties(self.repetition_penalty, self.presence_penalty, self.frequency_penalty)

    @property
    def plain_greedy(self) -> bool:
        """True when the next token is just the argmax (the engine then picks it for the whole batch at once)."""
        return self.temperature < GREEDY_EPS and not self.penalties.active

    def sampler(self) -> TokenSampler:
        """A sampler for one request: its own generator, seeded by ``seed`` or at random."""
        seed = self.seed if self.seed is not None else random.SystemRandom().getrandbits(63)
        return TokenSampler(self, "cpu", seed)


@dataclass(frozen=True)
class FinishedGeneration:
    """A finished generation: its token ids (stop token included) and why it ended."""

    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    stop_token_id: int | None = None  # the id that ended it when finish_reason is "stop"
    stopped_by_eos: bool = False


@dataclass
class _Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    future: Future
    sampler: TokenSampler
    output_ids: list[int] = field(default_factory=list)
    error: Exception | None = None  # set when this sequence alone failed inside a step


@dataclass
class EngineStats:
    """Counters since start (read them with ``BatchEngine.stats()``)."""

    forward_passes: int = 0
    prefill_passes: int = 0
    decode_passes: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    finished_requests: int = 0
    cancelled_requests: int = 0
    failed_requests: int = 0  # failed on their own inside a step (the rest of their batch went on)
    peak_running: int = 0


class BatchEngine:
    """Runs generation requests in shared, KV-cached, padded batches on one worker thread."""

    def __init__(self, model, *, eos_token_ids: set[int], max_model_len: int, max_batch_size: int = 32,
                 max_prefill_tokens: int = 8192, pad_token_id: int = 0):
        if max_batch_size < 1 or max_prefill_tokens < 1:
            raise ValueError("max_batch_size and max_prefill_tokens must be at least 1")
        self.model = model.eval()
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_model_len = max_model_len
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.pad_token_id = pad_token_id
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._batch = self._new_batch(0)  # refuses models that are not full-attention
        self._wake = threading.Condition()
        self._stopping = False
        self._stats = EngineStats()
        self._thread = threading.Thread(target=self._work, name="batch-engine", daemon=True)

    def start(self) -> BatchEngine:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the worker; requests not finished get an error."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join()
        for sequence in [*self._running, *self._waiting]:
            _fail(sequence.future, RuntimeError("the server is shutting down"))
        self._running.clear()
        self._waiting.clear()

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Future:
        """Queue a request; the future resolves to a ``FinishedGeneration``. Cancel the future to abandon it."""
        max_new = min(params.max_tokens, self.max_model_len - len(prompt_ids))
        if not prompt_ids or max_new < 1:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room in {self.max_model_len}")
        sequence = _Sequence(list(prompt_ids), params, max_new, Future(), params.sampler())
        with self._wake:
            if self._stopping:
                raise RuntimeError("the server is shutting down")
            self._waiting.append(sequence)
            self._wake.notify()
        return sequence.future

    def stats(self) -> dict:
        """Counters plus the current running/waiting sizes."""
        with self._wake:
            waiting = len(self._waiting)
        return {**vars(self._stats), "running": len(self._running), "waiting": waiting}

    # -- worker thread -------------------------------------------------------------------------------------

    def _work(self) -> None:
        with torch.inference_mode():
            while True:
                with self._wake:
                    while not self._stopping and not self._waiting and not self._running:
                        self._wake.wait()
                    if self._stopping:
                        return
                    admitted = self._take_admissible()
                self._drop_cancelled()
                try:
                    if admitted:
                        self._prefill_isolated(admitted)
                    if self._running:
                        self._decode_step_isolated()
                except Exception as error:  # not one request's fault (e.g. out of memory): fails what runs
                    for sequence in self._running:
                        _fail(sequence.future, error)
                    self._running, self._batch = [], self._new_batch(0)

    def _take_admissible(self) -> list[_Sequence]:
        taken: list[_Sequence] = []
        width = 0
        while self._waiting and len(self._running) + len(taken) < self.max_batch_size:
            candidate = self._waiting[0]
            if candidate.future.cancelled():
                self._waiting.popleft()
                self._stats.cancelled_requests += 1
                continue
            new_width = max(width, len(candidate.prompt_ids))
            if taken and new_width * (len(taken) + 1) > self.max_prefill_tokens:
                break
            taken.append(self._waiting.popleft())
            width = new_width
        return taken

    def _new_batch(self, rows: int) -> DecodeBatch:
        return DecodeBatch([self.model], rows, self.pad_token_id)

    def _forward(self, batch: DecodeBatch, feeds: list[list[int]]) -> torch.Tensor:
        (logits,) = batch.step(feeds)
        self._stats.forward_passes += 1
        return logits

    def _prefill_isolated(self, group: list[_Sequence]) -> None:
        """Prefill ``group`` together; if that pass fails, each sequence alone (only the failing ones fail)."""
        try:
            self._prefill(group)
        except Exception as error:
            if len(group) == 1:
                self._stats.failed_requests += 1
                _fail(group[0].future, error)
                return
            for sequence in group:
                self._prefill_isolated([sequence])

    def _decode_step_isolated(self) -> None:
        """One decode step for the batch; if it fails, every sequence is recomputed on its own."""
        try:
            self._decode_step()
        except Exception:
            running, self._running, self._batch = self._running, [], self._new_batch(0)
            for sequence in running:
                self._prefill_isolated([sequence])

    def _prefill(self, group: list[_Sequence]) -> None:
        """Run ``group``'s tokens so far (prompt, plus output when recomputing) and pick each next token."""
        batch = self._new_batch(len(group))
        logits = self._forward(batch, [s.prompt_ids + s.output_ids for s in group])
        self._stats.prefill_passes += 1
        self._stats.prompt_tokens += sum(len(s.prompt_ids) for s in group if not s.output_ids)
        self._choose(group, logits)
        self._batch.extend(batch)
        self._running.extend(group)
        self._stats.peak_running = max(self._stats.peak_running, len(self._running))
        self._retire_finished()

    def _decode_step(self) -> None:
        logits = self._forward(self._batch, [[s.output_ids[-1]] for s in self._running])
        self._stats.decode_passes += 1
        self._choose(self._running, logits)
        self._retire_finished()

    def _choose(self, sequences: list[_Sequence], logits: torch.Tensor) -> None:
        """Append every sequence's next token (argmax for the whole batch, samplers where needed); a sampler
        that fails marks its sequence failed (it keeps the argmax so the batch keeps its shape)."""
        tokens = logits.argmax(-1)
        for row, sequence in enumerate(sequences):
            if not sequence.params.plain_greedy:
                try:
                    scores = sequence.params.penalties.apply(logits[row:row + 1], sequence.prompt_ids,
                                                             sequence.output_ids)
                    tokens[row] = sequence.sampler(scores)[0]
                except Exception as error:  # this request's sampling only
                    sequence.error = error
        for sequence, token in zip(sequences, tokens.tolist(), strict=True):
            sequence.output_ids.append(token)
        self._stats.generated_tokens += len(sequences)

    def _retire_finished(self) -> None:
        keep = []
        for row, sequence in enumerate(self._running):
            if sequence.error is not None:
                self._stats.failed_requests += 1
                _fail(sequence.future, sequence.error)
                continue
            generation = self._finished(sequence)
            if generation is None:
                keep.append(row)
                continue
            self._stats.finished_requests += 1
            _resolve(sequence.future, generation)
        self._keep_rows(keep)

    def _finished(self, sequence: _Sequence) -> FinishedGeneration | None:
        token = sequence.output_ids[-1]
        if token in self.eos_token_ids and not sequence.params.ignore_eos:
            return FinishedGeneration(list(sequence.output_ids), "stop", token, stopped_by_eos=True)
        if token in sequence.params.stop_token_ids:
            return FinishedGeneration(list(sequence.output_ids), "stop", token)
        if len(sequence.output_ids) >= sequence.max_new_tokens:
            return FinishedGeneration(list(sequence.output_ids), "length")
        return None

    def _drop_cancelled(self) -> None:
        keep = [row for row, s in enumerate(self._running) if not s.future.cancelled()]
        self._stats.cancelled_requests += len(self._running) - len(keep)
        self._keep_rows(keep)

    def _keep_rows(self, rows: list[int]) -> None:
        if len(rows) != len(self._running):
            self._running = [self._running[row] for row in rows]
            self._batch.keep(rows)


def _resolve(future: Future, generation: FinishedGeneration) -> None:
    try:
        future.set_result(generation)
    except InvalidStateError:  # cancelled by the client meanwhile
        pass


def _fail(future: Future, error: BaseException) -> None:
    try:
        future.set_exception(error)
    except InvalidStateError:
        pass
