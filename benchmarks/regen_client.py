"""Benchmark of the regen client against ``speculators regenerate-responses`` 0.9.0 on the same workload.

Both clients regenerate the same local JSONL through one stand-in vLLM server (a separate process with a
fixed latency per request), one after the other. Each client runs as its own process and is measured
with ``wait4``: wall time, user+system CPU seconds, peak RSS. A one-conversation run of each measures
its start-up cost, reported apart from the per-conversation CPU. First, both clients also regenerate
:data:`PARITY_FILE` (rows with and without ids, different column sets) and the resume keys
(``primary_id``) they write are compared: they must be the same set.

    python -m benchmarks.regen_client --sizes 10000,100000          # make bench-regen
    python -m benchmarks.regen_client --sizes 2000 --skip-speculators
    python -m benchmarks.regen_client --parity-only                 # just the resume-key check
    python -m benchmarks.regen_client --sizes 10000 --id-less-share 0.25   # a quarter of the rows without an id
    python -m benchmarks.regen_client --sizes 10000,20000,40000,160000 --speculators-sizes 20000 \
        --id-less-share 0.25 --concurrency 128                       # memory vs file size, CPU ratio at 20k

With ``--id-less-share`` that share of the rows has no ``id`` (evenly spread), so both clients key them by
speculators' content hash of the row ``datasets`` yields; the primary ids both clients wrote for every size
must then be the same set too. ``--speculators-sizes`` runs speculators at those sizes only (it is the slower
client), ``--max-tokens`` is sent by both (speculators ends a conversation whose prompt + completion exceed it,
so it may write fewer rows: the table counts each client's rows), and ``--source hf`` has regen read the file
as a local dataset folder streamed through ``datasets`` (the hub presets' path; speculators is not run on it).
The peak-RSS slope (KB per conversation, from one size to the next and from the smallest to the largest) is
printed beside the CPU ratio.

speculators is installed (once) into ``--speculators-venv`` with ``pip install --no-deps
speculators==0.9.0 hs-connectors==0.9.0`` plus the dependencies its CLI imports.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SPECULATORS_PINS = ["speculators==0.9.0", "hs-connectors==0.9.0"]
# What `speculators regenerate-responses` imports (read from its metadata; torchaudio/torchvision are not needed).
SPECULATORS_DEPENDENCIES = [
    "transformers>=5.0.0,<=5.19.0", "datasets>=4.0.0,<=5.1.0", "aiohttp", "typer>=0.12.0", "tqdm", "loguru",
    "pydantic>=2", "pydantic-settings>=2", "openai>=2", "httpx", "safetensors", "huggingface-hub", "psutil",
    "numpy>=2", "protobuf", "rich", "click",
]


# A local file mixing rows with and without ids and with different column sets (a blank line after the first row):
# speculators keys an id-less row by the row datasets gives it, not the line as written. The fast suite pins the keys
# speculators 0.9.0 wrote for this file (tests/regen/test_speculators_keys.py); --parity-only checks them again.
PARITY_FILE = REPO_ROOT / "tests" / "fixtures" / "speculators_parity.jsonl"


@dataclass
class Measurement:
    client: str
    conversations: int
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    rows: int

    @property
    def conversations_per_s(self) -> float:
        return self.conversations / self.wall_s if self.wall_s else 0.0


def default_tokenizer() -> Path:
    """The MiniMind-3 tokenizer when present, else a stand-in written under out/."""
    for candidate in (os.environ.get("MINIMIND_TOKENIZER"), REPO_ROOT.parent / "shared" / "minimind3-tokenizer"):
        if candidate and (Path(candidate) / "tokenizer.json").is_file():
            return Path(candidate)
    from common.minimind.standin_tokenizer import build_standin_tokenizer

    return build_standin_tokenizer(REPO_ROOT / "out" / "bench" / "standin-tokenizer")


def ensure_speculators(venv: Path) -> Path:
    """The ``speculators`` executable of ``venv``, installing it there first if needed."""
    executable = venv / "bin" / "speculators"
    if executable.exists():
        return executable
    print(f"installing speculators 0.9.0 into {venv} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    if subprocess.run([*pip, "torch==2.13.0"]).returncode != 0:
        subprocess.run([*pip, "torch>=2.9,<=2.14.1"], check=True)
    subprocess.run([*pip, "--no-deps", *SPECULATORS_PINS], check=True)
    subprocess.run([*pip, *SPECULATORS_DEPENDENCIES], check=True)
    return executable


def write_dataset(path: Path, conversations: int, turns: int, id_less_share: float = 0.0) -> Path:
    """``conversations`` rows with ``turns`` user turns each (messages form), with ids except on
    ``id_less_share`` of them (evenly spread: 0.25 leaves out every 4th row's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for index in range(conversations):
            messages = []
            for turn in range(turns):
                messages.append({"role": "user", "content": f"Question {turn} of conversation {index}: explain "
                                                            f"topic {index % 997} in a few sentences."})
                messages.append({"role": "assistant", "content": "An old answer that regen replaces."})
            id_less = int((index + 1) * id_less_share) > int(index * id_less_share)
            out.write(json.dumps({"messages": messages} if id_less else {"id": f"bench-{index}", "messages": messages})
                      + "\n")
    return path


_PRIMARY_ID = re.compile(r'"primary_id": ?"((?:[^"\\]|\\.)*)"')


def written_keys(output: Path) -> set[str]:
    """The primary ids an output file holds (read from each row's head, without parsing the whole row)."""
    with output.open(encoding="utf-8") as rows:
        return {json.loads(f'"{match.group(1)}"') for line in rows if (match := _PRIMARY_ID.search(line))}


def measure(client: str, command: list[str], conversations: int, output: Path, log: Path) -> Measurement:
    """Run ``command`` to completion and read its resource usage."""
    for stale in (output, output.with_name(f"{output.stem}.errors.jsonl"), output.with_name(f"{output.stem}.summary.json")):
        stale.unlink(missing_ok=True)
    started = time.monotonic()
    with log.open("w") as log_file:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{client} exited with {process.returncode}; see {log}")
    rows = sum(1 for _ in output.open()) if output.exists() else 0
    return Measurement(client, conversations, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, rows)


def start_server(tokenizer: Path, latency_ms: float, answer_words: int) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "standins.vllm_server", "--port", "0", "--latency-ms", str(latency_ms),
         "--tokenizer", str(tokenizer / "tokenizer.json"), "--model", str(tokenizer), "--max-lifetime-s", "7200",
         "--completion-words", str(answer_words)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline()
    if not line.startswith("READY "):
        server.kill()
        raise RuntimeError(f"stand-in server did not start: {line!r}")
    return server, line.split()[1]


def as_dataset_folder(data: Path) -> Path:
    """``data`` as the ``train`` split of a local dataset folder (what ``datasets`` streams for a hub preset)."""
    folder = data.with_name(f"{data.stem}_hf")
    folder.mkdir(exist_ok=True)
    split = folder / "train.jsonl"
    if not split.exists():
        split.hardlink_to(data)
    return folder


def client_commands(url: str, data: Path, out_dir: Path, tokenizer: Path, concurrency: int,
                    speculators: Path | None, max_tokens: int | None = None,
                    source: str = "local") -> dict[str, tuple[list[str], Path]]:
    ours_output = out_dir / f"ours_{data.stem}{'_hf' if source == 'hf' else ''}.jsonl"
    dataset = (["dataset=local", f"dataset.path={data}"] if source == "local" else
               ["dataset=ultrachat", f"dataset.path={as_dataset_folder(data)}", "dataset.split=train"])
    commands = {"regen (this repo)": ([
        sys.executable, "regen/main.py", *dataset, "server=external",
        f"server.endpoints=[{url}]", f"tokenizer={tokenizer}", f"output={ours_output}", f"concurrency={concurrency}",
        *([f"max_tokens={max_tokens}"] if max_tokens else []),
        "progress_log_s=3600", f"hydra.run.dir={out_dir / 'hydra'}"], ours_output)}
    if speculators is not None and source == "local":
        theirs_output = out_dir / f"speculators_{data.stem}.jsonl"
        commands["speculators 0.9.0"] = ([
            str(speculators), "regenerate-responses", "--endpoint", f"{url}/v1/chat/completions",
            "--dataset", str(data), "--concurrency", str(concurrency), "--outfile", str(theirs_output),
            *(["--max-tokens", str(max_tokens)] if max_tokens else [])], theirs_output)
    return commands


def check_parity(url: str, work_dir: Path, tokenizer: Path, speculators: Path) -> dict:
    """Both clients on :data:`PARITY_FILE`: the primary ids they write must be the same set."""
    data = PARITY_FILE
    rows = sum(1 for line in data.read_text().splitlines() if line.strip())
    written = {}
    for client, (command, output) in client_commands(url, data, work_dir, tokenizer, 4, speculators).items():
        measure(client, command, rows, output, work_dir / f"{output.stem}.log")
        written[client] = sorted({json.loads(line)["primary_id"] for line in output.open()})
    ours, theirs = written.values()
    result = {"rows": rows, "same": ours == theirs, "ours": ours, "speculators": theirs}
    print(f"resume-key parity with speculators 0.9.0 on {rows} mixed rows: "
          + ("same primary ids" if result["same"] else f"DIFFERENT: ours {ours}, speculators {theirs}"))
    return result


def print_table(results: list[Measurement], startup: dict[str, Measurement]) -> None:
    header = f"{'client':<20} {'convs':>8} {'rows':>8} {'wall s':>8} {'conv/s':>8} {'CPU s':>8} {'CPU s/1k':>9} " \
             f"{'CPU s/1k*':>10} {'peak RSS MB':>12}"
    print(header)
    print("-" * len(header))
    for m in results:
        net = (m.cpu_s - startup[m.client].cpu_s) / m.conversations * 1000 if m.client in startup else float("nan")
        print(f"{m.client:<20} {m.conversations:>8} {m.rows:>8} {m.wall_s:>8.1f} {m.conversations_per_s:>8.1f} {m.cpu_s:>8.1f} "
              f"{m.cpu_s / m.conversations * 1000:>9.2f} {net:>10.2f} {m.peak_rss_mb:>12.1f}")
    print("CPU s/1k* = CPU seconds per 1,000 conversations without the client's start-up "
          "(measured by a one-conversation run).")


def compare(results: list[Measurement], startup: dict[str, Measurement]) -> dict:
    """Ratios the targets are stated in: our CPU vs speculators', RSS growth from the smallest to largest size."""
    ours = sorted((m for m in results if m.client.startswith("regen")), key=lambda m: m.conversations)
    theirs = {m.conversations: m for m in results if m.client.startswith("speculators")}
    figures: dict = {}
    if len(ours) > 1:
        figures["rss_growth"] = ours[-1].peak_rss_mb / ours[0].peak_rss_mb
        figures[f"rss_mb_{ours[-1].conversations}_minus_{ours[0].conversations}"] = \
            ours[-1].peak_rss_mb - ours[0].peak_rss_mb
        for low, high in [*itertools.pairwise(ours), *([(ours[0], ours[-1])] if len(ours) > 2 else [])]:
            figures[f"rss_kb_per_conversation_{low.conversations}_to_{high.conversations}"] = \
                (high.peak_rss_mb - low.peak_rss_mb) * 1024 / (high.conversations - low.conversations)
    for m in ours:
        if m.conversations in theirs:
            other = theirs[m.conversations]
            figures[f"cpu_ratio_at_{m.conversations}"] = m.cpu_s / other.cpu_s
            if m.rows != other.rows:  # speculators stopped conversations at max_tokens: compare per row written
                figures[f"cpu_ratio_per_row_at_{m.conversations}"] = (m.cpu_s / m.rows) / (other.cpu_s / other.rows)
            net_ours = m.cpu_s - startup[m.client].cpu_s
            figures[f"cpu_ratio_without_startup_at_{m.conversations}"] = net_ours / (other.cpu_s - startup[other.client].cpu_s)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description="regen client benchmark (vs speculators regenerate-responses)")
    parser.add_argument("--sizes", default="10000,100000", help="conversation counts, comma separated")
    parser.add_argument("--turns", type=int, default=2, help="user turns (requests) per conversation")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="stand-in server latency per request")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--answer-words", type=int, default=400, help="words per stand-in answer (400 words = 592 MiniMind-3 tokens)")
    parser.add_argument("--work-dir", type=Path, default=REPO_ROOT / "out" / "bench" / "regen")
    parser.add_argument("--speculators-venv", type=Path, default=REPO_ROOT / "out" / "bench" / "speculators-venv")
    parser.add_argument("--skip-speculators", action="store_true")
    parser.add_argument("--parity-only", action="store_true", help="only compare the resume keys on PARITY_FILE")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer folder (default: MiniMind-3's, else a stand-in)")
    parser.add_argument("--id-less-share", type=float, default=0.0,
                        help="share of the rows without an id (keyed by speculators' content hash), e.g. 0.25")
    parser.add_argument("--speculators-sizes", help="run speculators at these sizes only (default: every size)")
    parser.add_argument("--max-tokens", type=int, help="max_tokens both clients send (default: each its own, 8192)")
    parser.add_argument("--source", choices=("local", "hf"), default="local",
                        help="hf: regen reads the file as a local dataset folder streamed through datasets")
    args = parser.parse_args()

    sizes = [int(size) for size in args.sizes.split(",")]
    speculators_sizes = set(sizes if args.speculators_sizes is None else
                            (int(size) for size in args.speculators_sizes.split(",")))
    if args.source == "hf":
        args.skip_speculators = True
    args.work_dir = args.work_dir.resolve()
    args.work_dir.mkdir(parents=True, exist_ok=True)  # the parity check writes there before any dataset
    tokenizer = (args.tokenizer or default_tokenizer()).resolve()
    speculators = None if args.skip_speculators else ensure_speculators(args.speculators_venv)
    server, url = start_server(tokenizer, args.latency_ms, args.answer_words)
    results: list[Measurement] = []
    startup: dict[str, Measurement] = {}
    parity = None
    key_parity: dict[int, bool] = {}
    try:
        if speculators is not None:
            parity = check_parity(url, args.work_dir, tokenizer, speculators)
            if not parity["same"]:
                raise SystemExit("the resume keys differ from speculators'")
        suffix = f"_idless{args.id_less_share:g}" if args.id_less_share else ""
        for size in [] if args.parity_only else [1, *sizes]:
            data = write_dataset(args.work_dir / f"bench_{size}{suffix}.jsonl", size, args.turns, args.id_less_share)
            with_speculators = speculators if size == 1 or size in speculators_sizes else None
            commands = client_commands(url, data, args.work_dir, tokenizer, args.concurrency, with_speculators,
                                       args.max_tokens, args.source)
            for client, (command, output) in commands.items():
                print(f"running {client} on {size} conversations ...", flush=True)
                measured = measure(client, command, size, output, args.work_dir / f"{Path(output).stem}.log")
                # with max_tokens a client may write fewer rows: speculators ends a conversation whose prompt +
                # completion exceed it, regen one whose answer was cut at it (the stand-in cuts as vLLM does)
                if measured.rows != size * args.turns and not args.max_tokens:
                    raise RuntimeError(f"{client} wrote {measured.rows} rows, expected {size * args.turns}")
                if size == 1:
                    startup[client] = measured
                else:
                    results.append(measured)
            if args.id_less_share and with_speculators is not None:
                ours, theirs = (written_keys(output) for _, output in commands.values())
                key_parity[size] = ours == theirs
                print(f"  primary ids of the {size} conversations: "
                      + ("the same set" if ours == theirs else f"DIFFERENT ({len(ours ^ theirs)} differ)"), flush=True)
                if ours != theirs:
                    raise SystemExit("the resume keys differ from speculators'")
    finally:
        server.kill()
        server.wait()
        server.stdout.close()
    figures = compare(results, startup)
    if results:
        print(f"\nstand-in latency {args.latency_ms:g} ms, concurrency {args.concurrency}, {args.turns} turn(s) per "
              f"conversation, {args.id_less_share:.0%} of rows without an id, max_tokens {args.max_tokens or 'default'}, "
              f"source {args.source}, tokenizer {tokenizer}\n")
        print_table(results, startup)
        for name, value in figures.items():
            print(f"{name}: {value:.3f}")
    report = {"settings": {k: str(v) for k, v in vars(args).items()}, "parity": parity, "key_parity": key_parity,
              "startup": {k: asdict(v) for k, v in startup.items()},
              "results": [asdict(m) | {"conversations_per_s": m.conversations_per_s} for m in results],
              "figures": figures}
    (args.work_dir / "benchmark.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwritten: {args.work_dir / 'benchmark.json'}")


if __name__ == "__main__":
    main()
