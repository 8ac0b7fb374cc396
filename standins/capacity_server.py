"""The capacity-model stand-in vLLM server: speaks the stand-in's dialect, runs at the speed of a modelled GPU.

Each chat request is answered as :class:`standins.vllm_server.SyntheticResponder` answers it (the same
``prompt_token_ids``, ``choices[0].token_ids`` and ``usage``), but only once a
:class:`standins.scheduler_model.SchedulerModel` has prefilled its prompt and generated every one of its
tokens: at most ``max_num_seqs`` running, a KV cache of ``kv_cache_tokens``, chunked prefill, preemption,
prefix caching, and a step time that grows with the batch. The engine loop sleeps each step's modelled
duration divided by ``time_scale`` against a running deadline (a step the CPU delays is made up by the
next ones), so the server's speed comes from the model, not from the machine. A prompt and answer that
could never fit in the KV cache get HTTP 400, as vLLM refuses a prompt longer than it can hold.

``GET /metrics`` exposes the scheduler as vLLM's Prometheus endpoint does (``model_name`` and ``engine``
labels, counters with ``_total`` and ``_created``), plus ``standin:simulated_seconds`` (the model's clock).

    python -m standins.capacity_server --max-num-seqs 256 --kv-cache-tokens 50000 --time-scale 4   # READY url
"""

from __future__ import annotations

import argparse
import asyncio
import time

from standins.scheduler_model import Request, SchedulerModel, SchedulerSettings
from standins.vllm_server import Reply, StandinServer, SyntheticResponder

# (vLLM's metric name, type, help) in the order vLLM registers them.
EXPOSED = [
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    ("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of queried tokens."),
    ("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens."),
    ("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine."),
    ("vllm:prompt_tokens", "counter", "Number of prefill tokens processed."),
    ("vllm:generation_tokens", "counter", "Number of generation tokens processed."),
    ("standin:simulated_seconds", "gauge", "Simulated seconds the capacity model has run (not a vLLM metric)."),
]


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class CapacityEngine:
    """A :class:`SchedulerModel` driven in (scaled) real time; :meth:`run` is its engine loop."""

    def __init__(self, settings: SchedulerSettings, time_scale: float = 1.0, model_name: str = "standin"):
        self.model = SchedulerModel(settings)
        self.time_scale, self.model_name = time_scale, model_name
        self.created = time.time()
        self._done: dict[int, asyncio.Future] = {}
        self._arrived = asyncio.Event()

    def fits(self, tokens: int) -> bool:
        """A request of this many tokens (prompt and answer) can ever be held in the KV cache."""
        return tokens <= self.model.num_blocks * self.model.settings.block_size

    async def generate(self, token_ids: list[int], prompt_len: int) -> None:
        """Return once the model has generated ``token_ids[prompt_len:]`` after the prompt."""
        request = Request(token_ids, prompt_len, self.model.settings.block_size)
        done = asyncio.get_running_loop().create_future()
        self._done[id(request)] = done
        self.model.submit(request)
        self._arrived.set()
        await done

    async def run(self) -> None:
        """Forever: one model step, then sleep its duration (scaled) against a running deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            duration, finished = self.model.step()
            if not duration:  # idle: wait for a request, and start the clock afresh
                self._arrived.clear()
                await self._arrived.wait()
                deadline = loop.time()
                continue
            deadline += duration / self.time_scale
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            for request in finished:
                self._done.pop(id(request)).set_result(None)

    def metrics_text(self) -> str:
        """The scheduler's state in Prometheus text format, named and labelled as vLLM's ``/metrics``."""
        model = self.model
        values = {
            "vllm:num_requests_running": len(model.running), "vllm:num_requests_waiting": len(model.waiting),
            "vllm:kv_cache_usage_perc": model.kv_usage, "vllm:prefix_cache_queries": model.prefix_cache_queries,
            "vllm:prefix_cache_hits": model.prefix_cache_hits, "vllm:num_preemptions": model.preemptions,
            "vllm:prompt_tokens": model.prompt_tokens, "vllm:generation_tokens": model.generation_tokens,
            "standin:simulated_seconds": model.clock_s,
        }
        labels = f'{{model_name="{_label(self.model_name)}",engine="0"}}'
        lines = []
        for name, kind, help_text in EXPOSED:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            if kind == "counter":
                lines += [f"{name}_total{labels} {float(values[name])!r}", f"{name}_created{labels} {self.created!r}"]
            else:
                lines.append(f"{name}{labels} {float(values[name])!r}")
        return "\n".join(lines) + "\n"


class CapacityResponder:
    """Answers as ``synthetic`` does, once ``engine`` has generated the answer."""

    def __init__(self, engine: CapacityEngine, synthetic: SyntheticResponder):
        self.engine, self.synthetic = engine, synthetic

    async def __call__(self, payload: dict) -> Reply:
        reply = self.synthetic(payload)
        prompt_ids, token_ids = reply.body["prompt_token_ids"], reply.body["choices"][0]["token_ids"]
        total = len(prompt_ids) + len(token_ids)
        if not self.engine.fits(total):
            return Reply({"error": {"message": f"prompt and answer ({total} tokens) exceed the KV cache "
                                               f"({self.engine.model.settings.kv_cache_tokens} tokens)",
                                    "code": 400}}, status=400)
        await self.engine.generate(prompt_ids + token_ids, len(prompt_ids))
        return reply


def start_capacity_server(settings: SchedulerSettings, synthetic: SyntheticResponder, *, time_scale: float = 1.0,
                          metrics: bool = True, host: str = "127.0.0.1") -> tuple[StandinServer, CapacityEngine]:
    """The server and its engine (call inside a running loop; then ``await server.start(port)`` and run
    ``engine.run()`` as a task)."""
    engine = CapacityEngine(settings, time_scale, synthetic.model)
    server = StandinServer(CapacityResponder(engine, synthetic), model=synthetic.model, host=host,
                           keep_requests=False, metrics=engine.metrics_text if metrics else None)
    return server, engine


def settings_from_args(args: argparse.Namespace) -> SchedulerSettings:
    return SchedulerSettings(max_num_seqs=args.max_num_seqs, kv_cache_tokens=args.kv_cache_tokens,
                             block_size=args.block_size, max_num_batched_tokens=args.max_num_batched_tokens,
                             step_base_s=args.step_base_ms / 1000, step_per_token_s=args.step_per_token_ms / 1000,
                             step_per_context_token_s=args.step_per_context_token_ms / 1000,
                             prefix_caching=not args.no_prefix_caching)


async def _serve(args: argparse.Namespace) -> None:
    synthetic = SyntheticResponder(args.tokenizer, args.completion_words, args.model, args.length_spread)
    server, engine = start_capacity_server(settings_from_args(args), synthetic, time_scale=args.time_scale,
                                           metrics=not args.no_metrics, host=args.host)
    url = await server.start(args.port)
    loop_task = asyncio.create_task(engine.run())
    print(f"READY {url}", flush=True)
    try:
        await asyncio.wait([loop_task], timeout=args.max_lifetime_s)
        if loop_task.done():
            loop_task.result()
    finally:
        loop_task.cancel()
        await server.stop()


def main() -> None:
    defaults = SchedulerSettings()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="standin")
    parser.add_argument("--tokenizer", help="tokenizer.json for prompts and answers (default: ids from bytes)")
    parser.add_argument("--completion-words", type=int, default=180, help="mean words per answer")
    parser.add_argument("--length-spread", type=float, default=0.5, help="answers vary by +- this fraction")
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    parser.add_argument("--kv-cache-tokens", type=int, default=defaults.kv_cache_tokens)
    parser.add_argument("--block-size", type=int, default=defaults.block_size)
    parser.add_argument("--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens)
    parser.add_argument("--step-base-ms", type=float, default=defaults.step_base_s * 1000)
    parser.add_argument("--step-per-token-ms", type=float, default=defaults.step_per_token_s * 1000)
    parser.add_argument("--step-per-context-token-ms", type=float, default=defaults.step_per_context_token_s * 1000)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--no-metrics", action="store_true", help="serve no /metrics (regen falls back)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="simulated seconds per real second")
    parser.add_argument("--max-lifetime-s", type=float, default=3600.0, help="stop on its own after this long")
    asyncio.run(_serve(parser.parse_args()))


if __name__ == "__main__":
    main()
