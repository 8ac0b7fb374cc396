"""`make demo` from a fresh clone: setup, tiny checkpoints, regen on the embedded server, the report; and the
report (``python -m regen.show_rows``) on rows it cannot show: one error naming the file, line and field."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from common.minimind.tokenizer import load_tokenizer
from launch.server_process import probe_models
from regen.show_rows import main
from tests.helpers.paths import REPO_ROOT


@pytest.mark.slow
def test_make_demo_from_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("MINIMIND_TOKENIZER", "VIRTUAL_ENV")}
    result = subprocess.run(["make", "demo"], cwd=clone, env=env, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = clone / "out" / "demo" / "sample.jsonl"
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    summary = json.loads((clone / "out" / "demo" / "sample.summary.json").read_text())
    assert summary["status"] == "completed" and summary["rows_written"] == len(rows) > 0
    for row in rows:
        assert len(row["input_ids"]) == len(row["loss_mask"])
        start = row["loss_mask"].index(1)
        assert set(row["loss_mask"][:start]) == {0} and set(row["loss_mask"][start:]) == {1}
    assert f"output: {output.relative_to(clone)}" in result.stdout
    assert "generated (loss_mask 1)" in result.stdout
    assert probe_models("http://127.0.0.1:8011") is None  # the embedded server was stopped


def show(argv: list[str], capsys) -> tuple[int, list[str], str]:
    """``python -m regen.show_rows ARGV`` in this process: its exit status, its stderr lines and its stdout's words."""
    with pytest.raises(SystemExit) as ended:
        main(argv)
        raise SystemExit(0)
    captured = capsys.readouterr()
    return ended.value.code, captured.err.splitlines(), " ".join(captured.out.split())


def test_show_rows_decodes_the_first_row_by_its_mask(tmp_path, tokenizer_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # rich wraps at 80 columns otherwise, within the long tmp path too
    tokenizer = load_tokenizer(str(tokenizer_path))
    prompt, generated = tokenizer.encode("What is 2+3?"), tokenizer.encode("It is 5.")
    output = tmp_path / "out.jsonl"
    row = {"id": "c0", "input_ids": prompt + generated, "loss_mask": [0] * len(prompt) + [1] * len(generated),
           "metadata": {"turn": 0}}
    output.write_text(json.dumps(row) + "\n" + json.dumps({**row, "id": "c1"}) + "\n")
    (tmp_path / "out.summary.json").write_text(json.dumps({"status": "completed", "rows_written": 2}))
    status, errors, out = show([str(output), "--tokenizer", str(tokenizer_path)], capsys)
    assert (status, errors) == (0, [])
    assert f"output: {output} (2 rows)" in out and '"status": "completed"' in out
    assert f"row c0: {len(prompt)} prompt tokens (loss_mask 0), {len(generated)} generated tokens" in out
    assert "What is 2+3?" in out and "It is 5." in out


@pytest.mark.parametrize("lines, summary, expected", [
    (None, None, ["error: {out}: no such file", "error: give the regen output JSONL (the run's output=)"]),
    ([{"input_ids": [1], "loss_mask": [1]}, "{bad"], None,
     ["error: {out}:2: invalid JSON: Expecting property name enclosed in double quotes (column 2)"]),
    ([[1, 2]], None, ["error: {out}:1: a row is a JSON object, got list"]),
    ([{"input_ids": [1, 2]}], None, ["error: {out}:1: loss_mask must be a list of integers"]),
    ([{"input_ids": [1, 2.0], "loss_mask": [0, 1]}], None, ["error: {out}:1: input_ids must be a list of integers"]),
    ([{"input_ids": [1, 2], "loss_mask": [0]}], None,
     ["error: {out}:1: input_ids (2) and loss_mask (1) differ in length"]),
    ([{"input_ids": [1, 2, 3], "loss_mask": [1, 0, 1]}], None, ["error: {out}:1: loss_mask is not 0s followed by 1s"]),
    ([{"input_ids": [1, 2], "loss_mask": [0, 2]}], None, ["error: {out}:1: loss_mask is not 0s followed by 1s"]),
    ([{"input_ids": [1, 10**9], "loss_mask": [0, 1]}], None,
     ["error: {out}:1: input_ids holds 1000000000, outside the tokenizer's {vocab} ids",
      "error: give the tokenizer the rows were written with (--tokenizer)"]),
    ([{"input_ids": [1], "loss_mask": [1]}], "[1]",
     ["error: {summary}: not a regen summary (a JSON list, not an object)"]),
])
def test_show_rows_names_the_file_line_and_field_of_what_it_cannot_show(tmp_path, tokenizer_path, capsys, lines,
                                                                         summary, expected):
    """A missing file, a line that is no JSON, a row without its fields or with a mask that is not 0s then 1s, an id
    the tokenizer lacks, a summary that is no object: one or two ``error:`` lines naming it, status 1."""
    output, summary_path = tmp_path / "out.jsonl", tmp_path / "out.summary.json"
    if lines is not None:
        output.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    if summary is not None:
        summary_path.write_text(summary)
    status, errors, _ = show([str(output), "--tokenizer", str(tokenizer_path)], capsys)
    vocab = len(load_tokenizer(str(tokenizer_path)))
    assert status == 1
    assert errors == [line.format(out=output, summary=summary_path, vocab=vocab) for line in expected]
