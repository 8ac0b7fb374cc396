"""Embedded server throughput: generated tokens/s at 1, 8 and 32 concurrent requests.

    python -m benchmarks.embedded_server [--models tiny,768x8] [--concurrency 1,8,32] [--max-tokens 64] [--rounds 2]

For each model (random weights in MiniMind's native format: the ``tiny`` preset, 128 wide x 2 layers, and
MiniMind-3's 768 wide x 8 layers) it starts the real embedded server through ``regen.servers`` (as
``server=local`` does), then for each concurrency level keeps that many requests in flight until
``rounds x concurrency`` requests are done. Every request is greedy with ``ignore_eos`` (vLLM's
parameter), so each one generates exactly ``--max-tokens`` tokens whatever the random model says. The
prompts are a fixed set of 32 chat messages. Figures are printed and written to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

MODELS = {  # name -> (teacher preset giving the architecture, seed)
    "tiny": ("tiny_teacher", 0),
    "768x8": ("agent_768", 1),
}
TOPICS = ["tides", "volcanoes", "prime numbers", "the printing press", "photosynthesis", "glaciers",
          "binary search", "coral reefs"]
STYLES = ["in one sentence", "for a child", "with an example", "as a short list"]
REPO_ROOT = Path(__file__).resolve().parents[1]


def fixed_prompts() -> list[list[dict]]:
    """32 chat prompts of varied length (the same every run)."""
    return [[{"role": "user", "content": f"Explain {topic} {style}." + " Be precise." * (i % 5)}]
            for i, (topic, style) in enumerate((t, s) for t in TOPICS for s in STYLES)]


def write_checkpoint(name: str, out_dir: Path) -> tuple[Path, dict]:
    """A random-weight native checkpoint for ``name`` and the server-block keys that describe it."""
    import torch
    from omegaconf import OmegaConf

    from common.minimind.model import build_model, save_native
    from common.minimind.spec import MiniMindArch

    preset, seed = MODELS[name]
    block = OmegaConf.to_container(OmegaConf.load(REPO_ROOT / "configs" / "model" / f"{preset}.yaml"))
    arch = MiniMindArch.from_config(block)
    torch.manual_seed(seed)
    path = save_native(build_model(arch), out_dir / f"bench_{name}.pth")
    return path, {k: getattr(arch, k) for k in arch.__dataclass_fields__}


def resolve_tokenizer(given: str | None, out_dir: Path) -> str:
    """``--tokenizer``, else $MINIMIND_TOKENIZER or ../shared's MiniMind-3 tokenizer, else a stand-in."""
    from common.minimind.standin_tokenizer import build_standin_tokenizer

    for candidate in (given, os.environ.get("MINIMIND_TOKENIZER"), str(REPO_ROOT.parent / "shared" / "minimind3-tokenizer")):
        if candidate and Path(candidate).exists():
            return candidate
    return str(build_standin_tokenizer(out_dir / "standin-tokenizer"))


async def run_level(base_url: str, model: str, prompts: list[list[dict]], concurrency: int, total: int,
                    max_tokens: int, progress: Progress, label: str) -> dict:
    """Keep ``concurrency`` requests in flight until ``total`` are done; tokens/s over the whole span."""
    task = progress.add_task(label, total=total)
    queue = list(range(total))
    tokens = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal tokens
        while queue:
            i = queue.pop()
            body = {"model": model, "messages": prompts[i % len(prompts)], "max_tokens": max_tokens,
                    "temperature": 0, "ignore_eos": True}
            async with session.post(f"{base_url}/v1/chat/completions", json=body) as response:
                reply = await response.json()
                if response.status != 200:
                    raise RuntimeError(f"server answered {response.status}: {reply}")
            tokens += reply["usage"]["completion_tokens"]
            progress.advance(task)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        before = await stats(session, base_url)
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - start
        after = await stats(session, base_url)
    passes = after["forward_passes"] - before["forward_passes"]
    return {"concurrency": concurrency, "requests": total, "generated_tokens": tokens, "seconds": round(seconds, 3),
            "tokens_per_s": round(tokens / seconds, 1), "forward_passes": passes,
            "tokens_per_pass": round(tokens / passes, 2) if passes else None}


async def stats(session: aiohttp.ClientSession, base_url: str) -> dict:
    async with session.get(f"{base_url}/stats") as response:
        return await response.json()


def bench_model(name: str, args: argparse.Namespace, work_dir: Path, tokenizer: str, progress: Progress) -> list[dict]:
    from common.config_schema import parse_config
    from launch.server_process import probe_models
    from regen.servers import provide_endpoints
    from regen.settings import ServerSettings

    checkpoint, arch = write_checkpoint(name, work_dir)
    port = args.port
    if probe_models(f"http://127.0.0.1:{port}") is not None:
        raise SystemExit(f"port {port} is taken by another server; pass --port")
    server = parse_config(ServerSettings, {
        "kind": "local", "checkpoint": str(checkpoint), "tokenizer": tokenizer, **arch, "model": None,
        "host": "127.0.0.1", "port": port, "max_batch_size": max(args.concurrency), "max_prefill_tokens": 8192,
        "max_model_len": None, "reasoning_parser": None, "tool_call_parser": "hermes", "threads": args.threads,
        "keep_server": False, "ready_timeout_s": 300, "stop_grace_s": 10,
        "log_file": str(work_dir / f"server_{name}.log")})
    prompts = fixed_prompts()
    results = []
    base_url = server.base_url
    with provide_endpoints(server):
        asyncio.run(run_level(base_url, str(checkpoint), prompts, 1, 1, args.max_tokens, progress,
                              f"{name} warm-up"))
        for concurrency in args.concurrency:
            level = asyncio.run(run_level(base_url, str(checkpoint), prompts, concurrency,
                                          args.rounds * concurrency, args.max_tokens, progress,
                                          f"{name} x{concurrency} concurrent"))
            results.append({"model": name, **level})
    return results


def report(results: list[dict], console: Console) -> dict:
    table = Table(title="embedded server throughput (greedy, ignore_eos, fixed max_tokens)")
    for column in ("model", "in flight", "requests", "tokens", "s", "tok/s", "passes", "tok/pass"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(r["model"], str(r["concurrency"]), str(r["requests"]), str(r["generated_tokens"]),
                      f"{r['seconds']:.2f}", f"{r['tokens_per_s']:.1f}", str(r["forward_passes"]),
                      str(r["tokens_per_pass"]))
    console.print(table)
    speedups = {}
    for model in dict.fromkeys(r["model"] for r in results):
        by_level = {r["concurrency"]: r["tokens_per_s"] for r in results if r["model"] == model}
        if 1 in by_level:
            top = max(by_level)
            speedups[model] = {"concurrency": top, "speedup_vs_1": round(by_level[top] / by_level[1], 2)}
            verdict = "meets" if speedups[model]["speedup_vs_1"] >= 4 else "MISSES"
            console.print(f"{model}: {top} concurrent = {speedups[model]['speedup_vs_1']}x the tokens/s of 1 "
                          f"({verdict} the 4x target)")
    return speedups


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.embedded_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,768x8", help=f"comma list of {list(MODELS)}")
    parser.add_argument("--concurrency", default="1,8,32", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="requests per level = rounds x concurrency")
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the server")
    parser.add_argument("--port", type=int, default=8091)
    parser.add_argument("--out", default="out/bench/serve.json")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    if unknown := set(models) - MODELS.keys():
        parser.error(f"unknown models {sorted(unknown)}; choose from {list(MODELS)}")
    console = Console()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp, Progress(console=console) as progress:
        work_dir = Path(tmp)
        tokenizer = resolve_tokenizer(args.tokenizer, work_dir)
        for name in models:
            results.extend(bench_model(name, args, work_dir, tokenizer, progress))
    speedups = report(results, console)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"max_tokens": args.max_tokens, "rounds": args.rounds, "tokenizer": tokenizer, "results": results,
               "speedups": speedups}
    out.write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"summary written to {out}")


if __name__ == "__main__":
    main()
