"""The teacher's rollouts of a seed (``opd/train.py``'s ``offline.cache_dir``, one cache file) kept in the run
folder, so that every arm distilling them trains on the same bytes, whichever machine or sitting runs it:

    python -m experiments.study.rollout_cache keep --cache-dir seed0/teacher_rollouts --kept seed0/teacher_rollouts.jsonl.gz
    python -m experiments.study.rollout_cache restore --kept ... --cache-dir ... --data distill_prompts.jsonl
    python -m experiments.study.rollout_cache check --kept ... --cache-dir ...

``keep`` gzips the folder's one cache file; ``restore`` writes it back under the name ``opd/train.py`` looks up
(from the key in its header); ``check`` fails unless the folder still holds exactly that file, unchanged: the run
after ``restore`` generated nothing of its own.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from common.atomic_write import atomic_write
from opd.rollouts.teacher_rollouts import TeacherRolloutCache


def _one_file(cache_dir: Path) -> Path:
    files = sorted(cache_dir.glob("*.jsonl"))
    if len(files) != 1:
        sys.exit(f"error: {cache_dir} holds {len(files)} teacher-rollout cache files, not one: "
                 f"{[file.name for file in files]}")
    return files[0]


def keep(cache_dir: Path, kept: Path) -> None:
    payload = gzip.compress(_one_file(cache_dir).read_bytes(), compresslevel=9, mtime=0)
    atomic_write(kept, lambda stream: stream.write(payload))


def restore(kept: Path, cache_dir: Path, data: Path) -> Path:
    text = gzip.decompress(kept.read_bytes())
    header = json.loads(text.split(b"\n", 1)[0])
    path = TeacherRolloutCache(cache_dir, data, header["key"]).path
    if path.exists() and path.read_bytes() != text:
        sys.exit(f"error: {path} exists and differs from {kept}; remove it to restore the kept rollouts")
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda stream: stream.write(text))
    return path


def check(kept: Path, cache_dir: Path) -> None:
    if _one_file(cache_dir).read_bytes() != gzip.decompress(kept.read_bytes()):
        sys.exit(f"error: the teacher-rollout cache in {cache_dir} is no longer the one kept in {kept}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("keep", "restore", "check"))
    parser.add_argument("--cache-dir", required=True, type=Path)
    parser.add_argument("--kept", required=True, type=Path)
    parser.add_argument("--data", type=Path, help="restore: the data file the cache belongs to")
    args = parser.parse_args(argv)
    if args.action == "keep":
        keep(args.cache_dir, args.kept)
    elif args.action == "check":
        check(args.kept, args.cache_dir)
    elif args.data is None:
        parser.error("restore needs --data")
    else:
        print(f"restored {restore(args.kept, args.cache_dir, args.data)}")


if __name__ == "__main__":
    main()
