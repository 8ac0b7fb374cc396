"""What the resume keys of id-less local rows cost: regen's port of ``datasets``' JSON builder against ``datasets``.

speculators keys a row without ``id``/``uuid`` by the sha256 of the row ``datasets.load_dataset("json", ...)``
yields. regen computes that row with ``regen.rows.speculators_keys`` (pyarrow's JSON reader, no ``datasets``, no
torch); the alternative is to load ``datasets`` for a file with id-less rows and read the rows from it. Each way
runs in a fresh process over the same generated JSONL (chat rows without ids: messages, tools on some, a ``meta``
object whose keys vary, a score that is an int or a float), measured with ``wait4``: wall seconds from the process'
start (imports included), user+system CPU seconds and peak RSS. Both must give the same keys, or it stops.

    python -m benchmarks.speculators_keys                     # 10k rows
    python -m benchmarks.speculators_keys --sizes 10000,40000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# Each way prints the sha256 of all its keys, so the two can be compared without passing 10k keys around.
PORT = """
import hashlib, json, sys
from pathlib import Path
from regen.rows.speculators_keys import LocalFileKeys
path = Path(sys.argv[1])
keys = LocalFileKeys(path)
digest = hashlib.sha256()
with path.open("rb") as lines:
    for ordinal, line in enumerate(lines):
        digest.update(keys.key(ordinal, json.loads(line)).encode())
print(digest.hexdigest())
"""
DATASETS = """
import hashlib, json, sys
from datasets import load_dataset
from regen.rows.conversation import content_hash, explicit_id
path = sys.argv[1]
rows = iter(load_dataset("json", data_files=path, split="train", streaming=True))
digest = hashlib.sha256()
with open(path, "rb") as lines:
    for line in lines:
        row, viewed = json.loads(line), next(rows)
        digest.update((explicit_id(row) or content_hash(viewed)).encode())
print(digest.hexdigest())
"""
WAYS = {"port (pyarrow, regen)": PORT, "datasets itself": DATASETS}


def chat_rows(count: int, seed: int = 0) -> list[dict]:
    """Id-less chat rows whose columns, shapes and types vary as real files' do."""
    rng = random.Random(seed)
    words = "the model answers each question with care and a short worked example".split()
    rows = []
    for index in range(count):
        turns = []
        for _ in range(rng.randint(1, 3)):
            turns += [{"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(8, 40)))},
                      {"role": "assistant", "content": " ".join(rng.choices(words, k=rng.randint(20, 80)))}]
        row: dict = {"messages": turns, "score": rng.choice([1, 2, 0.5, 3.25]),
                     "meta": {key: rng.randint(0, 9) for key in rng.sample(["a", "b", "c", "d"], rng.randint(1, 3))}}
        if index % 5 == 0:
            row["tools"] = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
        rows.append(row)
    return rows


def measure(code: str, path: Path) -> dict:
    """Wall and CPU seconds and peak RSS of one fresh process running ``code`` on ``path``, and its output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, env=env, cwd=REPO_ROOT)
    output = process.stdout.read().decode().strip()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise SystemExit(f"failed ({process.returncode}): {code}")
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "keys_sha256": output.splitlines()[-1]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000", help="rows per file, comma-separated")
    parser.add_argument("--out", default="out/bench/speculators_keys.json")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    for size in map(int, args.sizes.split(",")):
        path = out.parent / f"speculators_keys_{size}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(size)))
        figures = {way: measure(code, path) for way, code in WAYS.items()}
        if len({found["keys_sha256"] for found in figures.values()}) != 1:
            raise SystemExit(f"the keys differ at {size} rows: {figures}")
        for way, found in figures.items():
            print(f"{size:>7} rows  {way:<22} {found['wall_s']:>6.2f} s wall  {found['cpu_s']:>6.2f} s CPU  "
                  f"{found['peak_rss_mb']:>6.1f} MB peak RSS")
        results.append({"rows": size, "file_mb": round(path.stat().st_size / 2**20, 1), "ways": figures})
        path.unlink()
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
