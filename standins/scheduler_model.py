"""A model of vLLM's (V1) scheduler in simulated time: what the capacity stand-in server runs.

No GPU, no I/O: :class:`SchedulerModel` holds the running batch, the waiting queue and a paged KV cache, and
:meth:`SchedulerModel.step` performs one engine step, returning how long that step takes on the modelled
hardware. The rules follow vLLM's scheduler:

- at most ``max_num_seqs`` requests run; each step schedules at most ``max_num_batched_tokens`` tokens
  (one per decoding request, prompt chunks for the rest: chunked prefill);
- the KV cache is ``kv_cache_tokens`` tokens in blocks of ``block_size``; a request gets blocks as its
  tokens are computed. When a running request needs a block and none is free, the most recently admitted
  request is preempted (recompute mode: its blocks are freed and it goes back to the front of the
  waiting queue, to be prefilled again, prompt and tokens generated so far); a step that preempted admits
  nobody new;
- waiting requests are admitted in order while a slot, the token budget and their prompt's blocks allow;
- prefix caching: every full block is hashed with its predecessors (as vLLM does); a finished or
  preempted request's blocks stay cached while free, and a new request reuses the longest cached prefix
  of its tokens instead of computing it. Free blocks are reused least recently freed first, evicting what
  they cached. That is why a multi-turn conversation's next turn is cheap while the server has free
  blocks, and expensive when too many requests compete for the cache;
- a step takes ``step_base_s + step_per_token_s * tokens + step_per_context_token_s * context``
  (``tokens`` scheduled this step, ``context`` the tokens already in the KV cache of the requests it
  schedules): a fixed cost, compute that grows with the batch, attention that grows with its context.

``kv_usage`` is the fraction of blocks held by requests (cached free blocks count as free), as
``vllm:kv_cache_usage_perc`` reports it.
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerSettings:
    """The modelled server: its scheduler limits, its KV cache and the cost of one step."""

    max_num_seqs: int = 256
    kv_cache_tokens: int = 65536
    block_size: int = 16
    max_num_batched_tokens: int = 4096
    step_base_s: float = 0.012
    step_per_token_s: float = 0.00004
    step_per_context_token_s: float = 0.00000004
    prefix_caching: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "kv_cache_tokens", "block_size", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.kv_cache_tokens < self.block_size:
            raise ValueError("kv_cache_tokens must hold at least one block")


class Request:
    """One generation: ``token_ids`` = the prompt and the tokens it will generate (decided up front)."""

    __slots__ = ("token_ids", "prompt_len", "generated", "computed", "blocks", "block_hashes", "done")

    def __init__(self, token_ids: list[int], prompt_len: int, block_size: int):
        if not 0 < prompt_len < len(token_ids):
            raise ValueError("a request needs a prompt and at least one token to generate")
        self.token_ids, self.prompt_len = token_ids, prompt_len
        self.generated = 0  # tokens sampled so far
        self.computed = 0  # tokens whose KV is in the cache
        self.blocks: list[int] = []
        self.done = False
        self.block_hashes: list[int] = []
        parent = None
        for start in range(0, len(token_ids) - block_size + 1, block_size):
            parent = hash((parent, tuple(token_ids[start:start + block_size])))
            self.block_hashes.append(parent)

    @property
    def num_tokens(self) -> int:
        """Prompt plus tokens generated so far: what the KV cache must hold to generate the next one."""
        return self.prompt_len + self.generated

    @property
    def target(self) -> int:
        return len(self.token_ids) - self.prompt_len


class SchedulerModel:
    """The scheduler state of one simulated server and its counters (what ``/metrics`` exposes)."""

    def __init__(self, settings: SchedulerSettings):
        self.settings = settings
        self.num_blocks = settings.kv_cache_tokens // settings.block_size
        self._free: OrderedDict[int, None] = OrderedDict((block, None) for block in range(self.num_blocks))
        self._refs = [0] * self.num_blocks
        self._block_hash: list[int | None] = [None] * self.num_blocks
        self._cached: dict[int, int] = {}  # block hash -> block
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.clock_s = 0.0  # simulated time: the sum of step durations
        self.steps = 0
        self.preemptions = 0
        self.prompt_tokens = 0  # prompt tokens computed (prefill, recomputation included)
        self.generation_tokens = 0
        self.prefix_cache_queries = 0  # tokens looked up in the prefix cache
        self.prefix_cache_hits = 0  # of those, tokens found
        self.requests_finished = 0

    @property
    def kv_usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def submit(self, request: Request) -> None:
        self.waiting.append(request)

    def _take_block(self) -> int:
        block, _ = self._free.popitem(last=False)
        evicted = self._block_hash[block]
        if evicted is not None:
            del self._cached[evicted]
            self._block_hash[block] = None
        self._refs[block] = 1
        return block

    def _allocate(self, request: Request, tokens: int) -> bool:
        """Blocks for ``tokens`` tokens of ``request``; False (and nothing taken) when too few are free."""
        needed = -(-tokens // self.settings.block_size) - len(request.blocks)
        if needed > len(self._free):
            return False
        for _ in range(needed):
            request.blocks.append(self._take_block())
        return True

    def _free_blocks(self, request: Request) -> None:
        for block in reversed(request.blocks):  # the tail first: it is the least likely to be shared
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None
        request.blocks = []
        request.computed = 0

    def _reuse_cached_prefix(self, request: Request) -> None:
        """Take the longest cached prefix of the request's tokens (never all of them: one is computed)."""
        block_size = self.settings.block_size
        lookup = min((request.num_tokens - 1) // block_size, len(request.block_hashes))
        self.prefix_cache_queries += request.num_tokens
        for index in range(lookup):
            block = self._cached.get(request.block_hashes[index])
            if block is None:
                break
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1
            request.blocks.append(block)
        request.computed = len(request.blocks) * block_size
        self.prefix_cache_hits += request.computed

    def _cache_full_blocks(self, request: Request, before: int) -> None:
        block_size = self.settings.block_size
        for index in range(before // block_size, min(request.computed // block_size, len(request.block_hashes))):
            block_hash = request.block_hashes[index]
            if block_hash not in self._cached:
                block = request.blocks[index]
                self._cached[block_hash] = block
                self._block_hash[block] = block_hash

    def _preempt_last(self) -> Request:
        victim = self.running.pop()
        self._free_blocks(victim)
        self.waiting.appendleft(victim)
        self.preemptions += 1
        return victim

    def _fit(self, request: Request, tokens: int) -> bool:
        """Blocks for ``tokens`` more tokens of a running request, preempting the most recently admitted
        requests while none are free; False when the request itself had to be preempted."""
        while not self._allocate(request, request.computed + tokens):
            if self._preempt_last() is request:
                return False
        return True

    def _schedule(self) -> list[tuple[Request, int]]:
        """This step's (request, tokens to compute) pairs, preempting and admitting as vLLM's scheduler does."""
        settings = self.settings
        budget = settings.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preemptions_before = self.preemptions
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            tokens = min(request.num_tokens - request.computed, budget)
            if not self._fit(request, tokens):
                break
            scheduled.append((request, tokens))
            budget -= tokens
            index += 1
        if self.preemptions > preemptions_before:
            return scheduled
        while self.waiting and len(self.running) < settings.max_num_seqs and budget > 0:
            request = self.waiting[0]
            if settings.prefix_caching:
                self._reuse_cached_prefix(request)
            tokens = min(request.num_tokens - request.computed, budget)
            if not self._allocate(request, request.computed + tokens):
                self._free_blocks(request)  # give back the cached prefix it took; it waits
                break
            self.waiting.popleft()
            self.running.append(request)
            scheduled.append((request, tokens))
            budget -= tokens
        return scheduled

    def step(self) -> tuple[float, list[Request]]:
        """One engine step: (its simulated duration in seconds, the requests it finished). Idle: (0, [])."""
        scheduled = self._schedule()
        if not scheduled:
            return 0.0, []
        settings = self.settings
        tokens = sum(count for _, count in scheduled)
        context = sum(request.computed for request, _ in scheduled)
        duration = settings.step_base_s + settings.step_per_token_s * tokens + settings.step_per_context_token_s * context
        finished = []
        for request, count in scheduled:
            before = request.computed
            request.computed += count
            if not (request.generated and before == request.num_tokens - 1):  # not a decode: (re)computed prompt
                self.prompt_tokens += count
            if settings.prefix_caching:
                self._cache_full_blocks(request, before)
            if request.computed == request.num_tokens:  # every token is in the cache: sample the next one
                request.generated += 1
                self.generation_tokens += 1
                if request.generated == request.target:
                    request.done = True
                    self._free_blocks(request)
                    finished.append(request)
        if finished:
            self.running = [request for request in self.running if not request.done]
            self.requests_finished += len(finished)
        self.clock_s += duration
        self.steps += 1
        return duration, finished


@dataclass(frozen=True)
class Workload:
    """Multi-turn conversations for :func:`fixed_concurrency_rate`: token counts drawn uniformly in ranges."""

    turns: int = 3
    first_prompt_tokens: tuple[int, int] = (200, 600)
    answer_tokens: tuple[int, int] = (128, 384)
    follow_up_tokens: tuple[int, int] = (20, 60)


def fixed_concurrency_rate(settings: SchedulerSettings, concurrency: int, workload: Workload = Workload(),
                           simulated_s: float = 300.0, warm_up_s: float = 60.0, seed: int = 0) -> float:
    """Generated tokens per simulated second when a client keeps ``concurrency`` conversations in flight.

    A closed loop in simulated time, no HTTP: each turn's prompt is the conversation so far (earlier
    prompts and answers) plus a new user message, submitted the moment the previous answer is done; a
    finished conversation is replaced at once. Only steps after ``warm_up_s`` count.
    """
    rng = random.Random(seed)
    model = SchedulerModel(settings)
    in_flight: dict[int, list] = {}  # id(request) -> [conversation tokens so far, turns left]

    def draw(bounds: tuple[int, int]) -> list[int]:
        return [rng.randrange(1, 50000) for _ in range(rng.randint(*bounds))]

    def submit(history: list[int], turns_left: int) -> None:
        request = Request(history + draw(workload.answer_tokens), len(history), settings.block_size)
        in_flight[id(request)] = [request, turns_left]
        model.submit(request)

    for _ in range(concurrency):
        submit(draw(workload.first_prompt_tokens), workload.turns - 1)
    counted_from = None
    while model.clock_s < simulated_s:
        if counted_from is None and model.clock_s >= warm_up_s:
            counted_from = (model.clock_s, model.generation_tokens)
        _, finished = model.step()
        for request in finished:
            _, turns_left = in_flight.pop(id(request))
            if turns_left:
                submit(request.token_ids + draw(workload.follow_up_tokens), turns_left - 1)
            else:
                submit(draw(workload.first_prompt_tokens), workload.turns - 1)
    start_s, start_tokens = counted_from
    return (model.generation_tokens - start_tokens) / (model.clock_s - start_s)
