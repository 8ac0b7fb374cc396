"""Benchmark of ``concurrency=auto`` against fixed concurrency on the capacity-model stand-in server.

For each server setting (:data:`SERVERS`: one whose best concurrency is high, one whose is low) and each
client setting (fixed 16, 64, 256, 1024 and ``auto``), a fresh ``python -m standins.capacity_server`` and
a ``regen/main.py`` run on the same multi-turn dataset are started; after ``--warm-up-s`` simulated
seconds the server's ``vllm:generation_tokens_total`` and simulated clock are read, again after
``--measure-s`` more, and regen is stopped (Ctrl-C: its summary says what ``auto`` chose). The figure is
generated tokens per simulated second over that window, so every setting is measured in the same
stretch of the run, ``auto``'s start from ``concurrency_start`` included. ``lag`` is the share of
simulated time the server fell behind the wall clock (0 when the CPU kept up).

The curve (PNG) is the same model's closed loop in simulated time (``scheduler_model.fixed_concurrency_rate``,
no HTTP) over many concurrencies, with the measured regen runs as points.

``--workload short`` measures a run that is over before a slow climb would pay off: 6,000 one-turn prompts of
about 128 tokens (answers of about 128) on the ``short`` server (``max_num_seqs`` 1024, room for about 700 of
those requests, a step of 8 ms + 0.02 ms a token: about 45 simulated seconds), fixed 64, 256, 512, 768, 1024
and ``auto``, each run to the end; the figure is the generated tokens over the simulated seconds of the whole run (what a user
waits for), the climb and the tail included. ``auto`` starts at ``concurrency_start=64`` in both workloads.

    python -m benchmarks.regen_concurrency            # make bench-concurrency (the long workload)
    python -m benchmarks.regen_concurrency --workload short
    python -m benchmarks.regen_concurrency --servers low --time-scale 4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from benchmarks.regen_client import default_tokenizer
from regen.endpoints.vllm_metrics import parse_sample
from standins.scheduler_model import SchedulerSettings, Workload, fixed_concurrency_rate

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVERS = {  # the modelled servers: a large KV cache (best near 800 in flight) and a small one (near 50)
    "high": SchedulerSettings(max_num_seqs=1024, kv_cache_tokens=800_000),
    "low": SchedulerSettings(max_num_seqs=256, kv_cache_tokens=50_000),
    # the short workload's: room for about 700 of its ~250-token requests (1024 runs into preemptions), and a
    # faster step (8 ms + 0.02 ms a token), so 6,000 of them take about 45 simulated seconds
    "short": SchedulerSettings(max_num_seqs=1024, kv_cache_tokens=160_000, step_base_s=0.008,
                               step_per_token_s=0.00002),
}
CLIENTS = ["16", "64", "256", "1024", "auto"]
SHORT_CLIENTS = ["64", "256", "512", "768", "1024", "auto"]
AUTO_START = 64  # auto's concurrency_start in these runs (speculators' default concurrency)
SHORT_ROWS, SHORT_PROMPT_BYTES, SHORT_ANSWER_WORDS = 6000, 470, 100  # ids from bytes (1 per 4): ~128 tokens each
CURVE = [8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 640, 768, 896, 1024]  # beyond, 300 s is no steady state
WORDS = "alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega".split()
# The dataset's text and the answers' lengths give about these token counts (ids from bytes: 1 per 4).
WORKLOAD = Workload(turns=3, first_prompt_tokens=(200, 600), answer_tokens=(128, 384), follow_up_tokens=(20, 60))


def write_dataset(path: Path, rows: int, seed: int = 0) -> Path:
    """``rows`` conversations of 3 user turns: a first message of 130-400 words, follow-ups of 13-40."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for index in range(rows):
            messages = []
            for turn in range(WORKLOAD.turns):
                count = rng.randint(130, 400) if turn == 0 else rng.randint(13, 40)
                text = f"c{index} t{turn}: " + " ".join(rng.choice(WORDS) for _ in range(count))
                messages += [{"role": "user", "content": text}, {"role": "assistant", "content": "old"}]
            out.write(json.dumps({"id": f"c{index}", "messages": messages}) + "\n")
    return path


def write_short_dataset(path: Path, rows: int, seed: int = 0) -> Path:
    """``rows`` one-turn conversations whose prompt is about 128 tokens (the stand-in's ids: 1 per 4 bytes)."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for index in range(rows):
            text, size = f"p{index}:", rng.randint(SHORT_PROMPT_BYTES * 9 // 10, SHORT_PROMPT_BYTES * 11 // 10)
            while len(text) < size:
                text += " " + rng.choice(WORDS)
            out.write(json.dumps({"id": f"s{index}", "messages": [{"role": "user", "content": text}]}) + "\n")
    return path


def read_counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return {name: value for name, value in filter(None, map(parse_sample, text.splitlines()))}


def start_server(settings: SchedulerSettings, time_scale: float, answer_words: int = 192) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "standins.capacity_server", "--max-num-seqs", str(settings.max_num_seqs),
               "--kv-cache-tokens", str(settings.kv_cache_tokens), "--time-scale", str(time_scale),
               "--step-base-ms", f"{settings.step_base_s * 1000:g}", "--step-per-token-ms",
               f"{settings.step_per_token_s * 1000:g}", "--step-per-context-token-ms",
               f"{settings.step_per_context_token_s * 1000:g}",
               "--completion-words", str(answer_words), "--length-spread", "0.5", "--max-lifetime-s", "3600"]
    server = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline()
    if not line.startswith("READY "):
        server.kill()
        raise RuntimeError(f"capacity stand-in did not start: {line!r}")
    return server, line.split()[1]


def measure(server_name: str, client: str, data: Path, tokenizer: Path, args: argparse.Namespace) -> dict:
    """One regen run against a fresh server: tokens per simulated second over the measured window (long), or
    over the whole run (short: regen runs to its end)."""
    short = args.workload == "short"
    work = args.work_dir / f"{'short_' if short else ''}{server_name}_{client}"
    work.mkdir(parents=True, exist_ok=True)
    output = work / "out.jsonl"
    for stale in work.glob("out*"):
        stale.unlink()
    server, url = start_server(SERVERS[server_name], args.time_scale, SHORT_ANSWER_WORDS if short else 192)
    command = [sys.executable, "regen/main.py", "dataset=local", f"dataset.path={data}", "server=external",
               f"server.endpoints=[{url}]", f"tokenizer={tokenizer}", f"output={output}", f"concurrency={client}",
               f"concurrency_start={AUTO_START}", f"concurrency_interval_s={2.0 / args.time_scale:g}",
               "progress_log_s=3600", f"hydra.run.dir={work / 'hydra'}"]
    try:
        with (work / "regen.log").open("w") as log:
            regen = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
            if short:  # from the first simulated step to regen's end
                first = read_counters(url)
                while first["standin:simulated_seconds"] == 0 and regen.poll() is None:
                    time.sleep(0.05)
                    first = read_counters(url)
                wall = time.monotonic()
                regen.wait(timeout=1800)
                last, wall = read_counters(url), time.monotonic() - wall
            else:
                time.sleep(args.warm_up_s / args.time_scale)
                first, wall = read_counters(url), time.monotonic()
                time.sleep(args.measure_s / args.time_scale)
                last, wall = read_counters(url), time.monotonic() - wall
                regen.send_signal(signal.SIGINT)
                regen.wait(timeout=300)
    finally:
        server.kill()
        server.wait()
        server.stdout.close()
    simulated = last["standin:simulated_seconds"] - first["standin:simulated_seconds"]
    summary = json.loads((work / "out.summary.json").read_text())
    [endpoint] = summary["endpoints"].values()
    return {
        "server": server_name, "concurrency": client,
        "tokens_per_s": (last["vllm:generation_tokens_total"] - first["vllm:generation_tokens_total"]) / simulated,
        "preemptions": last["vllm:num_preemptions_total"] - first["vllm:num_preemptions_total"],
        "prefix_cache_hit_rate": (last["vllm:prefix_cache_hits_total"] - first["vllm:prefix_cache_hits_total"])
        / max(1.0, last["vllm:prefix_cache_queries_total"] - first["vllm:prefix_cache_queries_total"]),
        "lag": max(0.0, 1 - simulated / (wall * args.time_scale)),
        "simulated_s": simulated, "conversations_done": summary.get("conversations_done"),
        "in_flight_mean": endpoint["in_flight_mean"], "limit": endpoint.get("in_flight_limit"),
        "limit_mean": endpoint.get("in_flight_limit_mean"), "control": endpoint["concurrency_control"],
        "regen_status": summary["status"],
    }


def curve(server_name: str, args: argparse.Namespace) -> list[tuple[int, float]]:
    return [(c, fixed_concurrency_rate(SERVERS[server_name], c, WORKLOAD, simulated_s=args.warm_up_s + args.measure_s,
                                       warm_up_s=args.warm_up_s)) for c in CURVE]


def plot(curves: dict, results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4.2), squeeze=False)
    for axis, (server_name, points) in zip(axes[0], curves.items(), strict=True):
        settings = SERVERS[server_name]
        axis.plot([c for c, _ in points], [r for _, r in points], "-", color="0.6", label="model, closed loop")
        fixed = [r for r in results if r["server"] == server_name and r["concurrency"] != "auto"]
        axis.plot([int(r["concurrency"]) for r in fixed], [r["tokens_per_s"] for r in fixed], "o", color="C0",
                  label="regen, fixed concurrency")
        for r in results:
            if r["server"] == server_name and r["concurrency"] == "auto":
                axis.plot([r["in_flight_mean"]], [r["tokens_per_s"]], "*", markersize=14, color="C3",
                          label=f"regen, auto (mean {r['in_flight_mean']:.0f} in flight)")
        axis.set_xscale("log", base=2)
        axis.set_xlabel("conversations in flight")
        axis.set_ylabel("generated tokens / simulated s")
        axis.set_title(f"{server_name}: max_num_seqs {settings.max_num_seqs}, KV {settings.kv_cache_tokens:,} tokens")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description="concurrency=auto vs fixed concurrency on the capacity stand-in")
    parser.add_argument("--workload", choices=("long", "short"), default="long",
                        help="long: 3-turn conversations, a window of a run; short: 6,000 one-turn prompts, whole runs")
    parser.add_argument("--servers", help=f"of {', '.join(SERVERS)} (default: high,low; short: short)")
    parser.add_argument("--clients", help="fixed numbers and/or auto (default: "
                        f"{','.join(CLIENTS)}; short: {','.join(SHORT_CLIENTS)})")
    parser.add_argument("--time-scale", type=float, default=8.0, help="simulated seconds per real second")
    parser.add_argument("--warm-up-s", type=float, default=60.0, help="simulated seconds before measuring")
    parser.add_argument("--measure-s", type=float, default=240.0, help="simulated seconds measured")
    parser.add_argument("--rows", type=int, default=6000, help="conversations in the dataset (long: never run out)")
    parser.add_argument("--work-dir", type=Path, default=REPO_ROOT / "out" / "bench" / "concurrency")
    parser.add_argument("--png", type=Path, default=REPO_ROOT / "out" / "bench" / "concurrency.png",
                        help="the curve (benchmarks/concurrency_curve.png in the README is a copy)")
    parser.add_argument("--no-curve", action="store_true", help="skip the closed-loop curve and the PNG")
    args = parser.parse_args()
    short = args.workload == "short"
    args.servers = args.servers or ("short" if short else "high,low")
    args.clients = args.clients or ",".join(SHORT_CLIENTS if short else CLIENTS)
    if short:
        args.no_curve = True  # the closed-loop curve is the long workload's
    started = time.monotonic()
    tokenizer = default_tokenizer().resolve()
    data = (write_short_dataset(args.work_dir / "short_prompts.jsonl", args.rows) if short
            else write_dataset(args.work_dir / "conversations.jsonl", args.rows))
    results = []
    for server_name in args.servers.split(","):
        for client in args.clients.split(","):
            print(f"{server_name} server, concurrency={client} ...", flush=True)
            results.append(measure(server_name, client, data, tokenizer, args))
            r = results[-1]
            print(f"  {r['tokens_per_s']:.0f} tok/s over {r['simulated_s']:.1f} simulated s, "
                  f"{r['in_flight_mean']} in flight on average, "
                  f"{r['preemptions']:.0f} preemptions, prefix hits {r['prefix_cache_hit_rate']:.0%}, "
                  f"lag {r['lag']:.1%}" + (f", limit {r['limit']} (mean {r['limit_mean']})" if r["limit"] else ""),
                  flush=True)
    curves = {} if args.no_curve else {name: curve(name, args) for name in args.servers.split(",")}
    if curves:
        plot(curves, results, args.png)
    print(f"\n{'server':<6} {'concurrency':>11} {'tok/s':>8} {'vs best fixed':>14} {'vs 64':>7} {'mean in flight':>15} "
          f"{'limit':>6} {'preempt':>8} {'prefix hits':>12} {'lag':>6}")
    figures = {}
    for server_name in args.servers.split(","):
        rows = [r for r in results if r["server"] == server_name]
        fixed = [r for r in rows if r["concurrency"] != "auto"]
        best = max((r["tokens_per_s"] for r in fixed), default=None)
        at_64 = next((r["tokens_per_s"] for r in fixed if r["concurrency"] == "64"), None)
        for r in rows:
            versus_best = f"{r['tokens_per_s'] / best:.2f}x" if best else "-"
            versus_64 = f"{r['tokens_per_s'] / at_64:.2f}x" if at_64 else "-"
            print(f"{server_name:<6} {r['concurrency']:>11} {r['tokens_per_s']:>8.0f} {versus_best:>14} {versus_64:>7} "
                  f"{r['in_flight_mean']:>15} {r['limit'] or '-':>6} {r['preemptions']:>8.0f} "
                  f"{r['prefix_cache_hit_rate']:>12.0%} {r['lag']:>6.1%}")
            if r["concurrency"] == "auto" and best:
                figures[server_name] = {"auto_vs_best_fixed": r["tokens_per_s"] / best,
                                        "auto_vs_64": r["tokens_per_s"] / at_64 if at_64 else None}
    elapsed = time.monotonic() - started
    print(f"\n{json.dumps(figures)}\nbenchmark took {elapsed / 60:.1f} minutes"
          + (f"; curve: {args.png}" if curves else ""))
    report = {"settings": {k: str(v) for k, v in vars(args).items()}, "servers": {
        name: vars(SERVERS[name]) for name in args.servers.split(",")}, "results": results,
        "curves": curves, "figures": figures, "elapsed_s": elapsed}
    report_path = args.work_dir / f"benchmark{'_short' if short else ''}.json"
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written: {report_path}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
