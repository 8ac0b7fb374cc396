"""Shared pieces of the regen end-to-end tests: writing a dataset, composing a config, reading outputs."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_configs import compose_config


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def regen_config(tmp_path: Path, urls: list[str], data: Path, tokenizer: Path, *overrides: str):
    """A composed regen config: local dataset, external endpoints, fast retries, output under tmp_path."""
    return compose_config("regen", [
        "dataset=local", f"dataset.path={data}", "server=external", f"server.endpoints=[{','.join(urls)}]",
        f"tokenizer={tokenizer}", f"output={tmp_path / 'out.jsonl'}", "retry_backoff_s=0.01", "max_backoff_s=0.05",
        "max_retries=2", "concurrency=4", *overrides,
    ])
