"""The output going away under a run: deleted mid-run, its folder turned read-only, temp files a killed run left."""

from __future__ import annotations

import json
import subprocess

import pytest

from common.user_errors import UserError
from regen.job import run
from regen.outputs.output_files import OutputGoneError
from tests.helpers.regen_support import EOS, ok, read_jsonl, regen_config, write_jsonl

ROWS = [{"id": f"c{i}", "prompt": f"q{i}"} for i in range(5)]


def start(serve, on_request):
    """A server whose n-th chat request (1-based) first calls ``on_request(n)``, then answers."""
    seen = []

    def answer(payload):
        seen.append(payload)
        on_request(len(seen))
        return ok("fine", [1, 5], [7, 8, EOS])

    return serve(answer)


def test_an_output_deleted_mid_run_stops_it_as_failed_and_resume_regenerates_what_went(serve, tmp_path,
                                                                                     tokenizer_path):
    """Before: later rows went into the deleted file, the run ended with a bare [Errno 2] and exit 1, and
    summary.json said "completed"."""
    output = tmp_path / "out.jsonl"
    server = start(serve, lambda n: output.unlink() if n == 3 else None)
    data = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    with pytest.raises(OutputGoneError, match=f"{output} was deleted or replaced while regen wrote to it"):
        run(regen_config(tmp_path, [server.url], data, tokenizer_path, "concurrency=1"))
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["status"].startswith("failed: OutputGoneError: ") and not output.exists()
    again = run(regen_config(tmp_path, [server.url], data, tokenizer_path, "concurrency=1", "resume=true"))
    assert again["status"] == "completed" and sorted(row["id"] for row in read_jsonl(output)) == [
        f"c{i}_gen0" for i in range(5)]


def test_an_output_replaced_mid_run_is_caught_too(serve, tmp_path, tokenizer_path):
    output = tmp_path / "out.jsonl"

    def replace(n: int) -> None:
        if n == 2:
            output.rename(tmp_path / "moved.jsonl")
            output.write_text("")

    server = start(serve, replace)
    with pytest.raises(OutputGoneError):
        run(regen_config(tmp_path, [server.url], write_jsonl(tmp_path / "rows.jsonl", ROWS), tokenizer_path,
                         "concurrency=1"))


@pytest.fixture
def immutable(tmp_path):
    """``freeze(path)``: make a folder read-only even for root (``chattr +i``: no file made or removed in it, the
    files already open still written); undone afterwards. Skips where the file system has no such attribute."""
    frozen = []

    def freeze(path) -> None:
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
            pytest.skip("chattr +i is not available here")
        frozen.append(path)

    yield freeze
    for path in frozen:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_folder_turned_read_only_mid_run_is_one_error_and_the_run_resumes(serve, tmp_path, tokenizer_path,
                                                                           immutable):
    """Before: a PermissionError traceback from the error file's compaction, a second one from releasing the lock,
    no summary, and the lock file left behind."""
    folder = tmp_path / "o"
    server = start(serve, lambda n: immutable(folder) if n == 5 else None)
    data = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    cfg = regen_config(tmp_path, [server.url], data, tokenizer_path, "concurrency=1", f"output={folder / 'out.jsonl'}")
    with pytest.raises(UserError, match=f"cannot write in {folder} \\(Operation not permitted\\): the summary is not "
                                        "written and out.errors.jsonl not compacted; the rows in out.jsonl are intact"):
        run(cfg)
    assert len(read_jsonl(folder / "out.jsonl")) == 5 and (folder / "out.lock").exists()  # unlocked, left behind
    subprocess.run(["chattr", "-i", str(folder)], check=True)
    again = run(regen_config(tmp_path, [server.url], data, tokenizer_path, f"output={folder / 'out.jsonl'}",
                             "resume=true"))
    assert again["status"] == "completed" and again["skipped_already_done"] == 5 and not (folder / "out.lock").exists()


def test_temp_files_a_killed_run_left_are_removed_at_the_next_start(serve, regen, tmp_path):
    """Before: the .tmp files of atomic writes interrupted by kill -9 stayed forever (21 MB after one loop)."""
    left = [tmp_path / name for name in (".out.jsonl.k2x9.tmp", ".out.errors.jsonl.a1.tmp", ".out.summary.json.q.tmp")]
    others = [tmp_path / name for name in (".other.jsonl.k2x9.tmp", "out.jsonl.tmp")]
    for path in [*left, *others]:
        path.write_bytes(b"x" * 1000)
    server = serve(lambda payload: ok("fine", [1, 5], [7, 8, EOS]))
    summary, out, _ = regen([server.url], ROWS[:1])
    assert summary["status"] == "completed" and len(out) == 1
    assert [path.exists() for path in left] == [False] * 3 and all(path.exists() for path in others)
