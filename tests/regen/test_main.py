"""``python regen/main.py`` as users run it: kill -9 then resume, one run per output (a second is refused
naming the first's pid), Hydra multirun, credentials that never reach a file, a torch-free client."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from regen.job import run
from regen.main import main
from standins.vllm_server import SyntheticResponder
from tests.helpers.entries import run_main
from tests.helpers.paths import REPO_ROOT
from tests.helpers.processes import communicate
from tests.helpers.regen_support import EOS, ok, read_jsonl, regen_config, write_jsonl
from tests.helpers.standin_vllm_cli import wait_until


def cli(*overrides: str) -> list[str]:
    return [sys.executable, "regen/main.py", *overrides]


class Gate:
    """Answers the first ``open_for`` requests; later ones wait until ``release`` (the run is stuck mid-way)."""

    def __init__(self, open_for: int):
        self.open_for, self.count, self.event = open_for, 0, None

    async def __call__(self, payload):
        self.count += 1
        if self.count > self.open_for:
            self.event = self.event or asyncio.Event()
            await self.event.wait()
        return ok("answer", [1, 5, 6], [7, 8, EOS])

    def release(self, loop) -> None:
        if self.event is not None:
            loop.call_soon_threadsafe(self.event.set)


def test_kill_9_mid_run_then_resume_finishes_every_conversation_once(serve, tmp_path, tokenizer_path):
    gate = Gate(open_for=100)
    stuck = serve(gate)
    rows = [{"id": f"k{i}", "messages": [{"role": "user", "content": f"q{i}"}, {"role": "user", "content": "more"}]}
            for i in range(300)]
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    output = tmp_path / "out.jsonl"
    process = subprocess.Popen(cli("dataset=local", f"dataset.path={data}", "server=external",
                                   f"server.endpoints=[{stuck.url}]", f"tokenizer={tokenizer_path}",
                                   f"output={output}", "concurrency=16", f"hydra.run.dir={tmp_path / 'h'}"),
                               cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: gate.count >= 100 + 16, process, "every worker waits at the gate")
    second = subprocess.run(cli("dataset=local", f"dataset.path={data}", "server=external",
                                f"server.endpoints=[{stuck.url}]", f"tokenizer={tokenizer_path}", f"output={output}",
                                "resume=true", f"hydra.run.dir={tmp_path / 'h2'}"),
                            cwd=REPO_ROOT, capture_output=True, text=True)
    assert second.returncode == 1 and "Traceback" not in second.stderr
    assert second.stderr.splitlines()[-2:] == [
        f"error: {output} is being written by another regen run (pid {process.pid}, lock {tmp_path / 'out.lock'})",
        "error: wait for it to finish (or stop it), or choose another output="]
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    gate.release(stuck.loop)
    before = Counter(row["primary_id"] for row in read_jsonl(output))
    assert 0 < len(before) < 300 and set(before.values()) == {2}

    fresh = serve(lambda payload: ok("answer", [1, 5, 6], [7, 8, EOS]))  # the OS dropped the killed run's lock
    summary = run(regen_config(tmp_path, [fresh.url], data, tokenizer_path, "resume=true", "concurrency=16"))
    counts = Counter(row["primary_id"] for row in read_jsonl(output))
    assert counts == {f"k{i}": 2 for i in range(300)}
    assert (summary["skipped_already_done"], summary["conversations_done"]) == (len(before), 300 - len(before))
    assert sorted(r["id"] for r in read_jsonl(output)) == sorted(f"k{i}_gen{k}" for i in range(300) for k in (0, 1))


def test_multirun_jobs_write_distinct_files_with_their_sampling(serve, tmp_path, tokenizer_path):
    server = serve(lambda payload: ok("hi", [1, 5], [6, EOS]), model="org/Tiny")
    data = write_jsonl(tmp_path / "rows.jsonl", [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}])
    result = run_main(main, "-m", "sampling.temperature=0.6,1.0", "dataset=local", f"dataset.path={data}",
                      "server=external", f"server.endpoints=[{server.url}]", f"tokenizer={tokenizer_path}",
                      f"output_dir={tmp_path / 'o'}", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    for temperature in ("0.6", "1.0"):
        rows = read_jsonl(tmp_path / "o" / f"rows_Tiny_sampling.temperature={temperature}.jsonl")
        assert sorted(r["id"] for r in rows) == ["a_gen0", "b_gen0"]
        assert {r["metadata"]["sampling_params"]["temperature"] for r in rows} == {float(temperature)}
    assert sorted(p["temperature"] for p in server.requests) == [0.6, 0.6, 1.0, 1.0]


def test_a_multirun_keeps_url_credentials_off_every_file_and_the_console(serve, tmp_path, tokenizer_path):
    """Before: each job's .hydra/overrides.yaml and hydra.yaml held Hydra's escaped form of the override
    (server.endpoints=[http\\://alice\\:PW@127.0.0.1\\:8130]), which the scrubbing missed, and the launcher's
    "[HYDRA] #0 : ..." console line showed it."""
    server = serve(lambda payload: ok("hi", [1, 5], [6, EOS]), model="org/Tiny")
    secret = "pw-3f9a2b"
    endpoint = server.url.replace("http://", f"http://alice:{secret}@")
    data = write_jsonl(tmp_path / "rows.jsonl", [{"id": "a", "prompt": "x"}])
    result = run_main(main, "-m", "sampling.temperature=0.6,1.0", "dataset=local", f"dataset.path={data}",
                      "server=external", f"server.endpoints=[{endpoint}]", f"tokenizer={tokenizer_path}",
                      f"output_dir={tmp_path / 'o'}", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != data]
    assert {"overrides.yaml", "hydra.yaml", "multirun.yaml"} <= {p.name for p in written}
    assert [p for p in written if secret in p.read_text(errors="replace")] == []
    shown = result.stdout + result.stderr
    assert "#0 : sampling.temperature=0.6" in shown and secret not in shown and "alice" not in shown
    assert server.server.authorizations[-1] == "Basic " + base64.b64encode(f"alice:{secret}".encode()).decode()


def test_client_import_chain_has_no_torch():
    code = ("import sys, regen.main, regen.job, benchmarks.regen_client, standins.vllm_server; "
            "print(sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.replace("'", '"')) == []


def test_credentials_in_an_endpoint_reach_no_file_and_no_console(serve, tmp_path, tokenizer_path):
    server = serve(lambda payload: ok("hi", [1, 5], [6, EOS]), model="org/Tiny")
    secret = "pw-3f9a2b"
    endpoint = server.url.replace("http://", f"http://alice:{secret}@") + "/v1"
    data = write_jsonl(tmp_path / "rows.jsonl", [{"id": "a", "prompt": "x"}, {"id": "b", "messages": []}])
    result = run_main(main, "dataset=local", f"dataset.path={data}", "server=external", f"server.endpoints=[{endpoint}]",
                      f"tokenizer={tokenizer_path}", f"output={tmp_path / 'o' / 'out.jsonl'}",
                      f"hydra.run.dir={tmp_path / 'h'}", cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert server.server.authorizations[-1] == "Basic " + base64.b64encode(f"alice:{secret}".encode()).decode()
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != data]
    assert {p.name for p in written} >= {"out.jsonl", "out.errors.jsonl", "out.summary.json", "out.manifest.json",
                                         "config.yaml", "overrides.yaml", "hydra.yaml"}
    assert [p for p in written if secret in p.read_text(errors="replace")] == []
    assert secret not in result.stdout + result.stderr
    rows = read_jsonl(tmp_path / "o" / "out.jsonl")
    assert rows[0]["metadata"]["endpoint"] == f"{server.url}/v1/chat/completions"


@pytest.mark.slow
def test_kill_loop_with_flaky_server_finishes_every_conversation_exactly_once(serve, tmp_path, tokenizer_path):
    """12 runs of `python regen/main.py ... resume=true`, each stopped at a random moment (seeded) by SIGINT,
    SIGTERM or kill -9 in turn, against a server answering a fifth of the requests with 503: no run prints a
    traceback or anything from asyncio; a signalled run ends with 130 / 143 (or 0 when it had finished) and its
    one interrupted line; the output only ever holds whole blocks but for a kill -9's torn tail; a last run
    finishes every conversation exactly once, with nothing in the error file."""
    server = serve(SyntheticResponder(str(tokenizer_path / "tokenizer.json"), completion_words=12,
                                      unavailable_share=0.2), latency_s=0.02, keep_requests=False)
    count = 1200
    rows = [{"id": f"k{i}", "messages": [{"role": "user", "content": f"q{i}"}, {"role": "user", "content": "more"}]}
            for i in range(count)]
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    output = tmp_path / "out.jsonl"

    def command(attempt: int) -> list[str]:
        return cli("dataset=local", f"dataset.path={data}", "server=external", f"server.endpoints=[{server.url}]",
                   f"tokenizer={tokenizer_path}", f"output={output}", "concurrency=8", "resume=true",
                   "max_retries=12", "retry_backoff_s=0.01", "max_backoff_s=0.05", "progress_log_s=0.5",
                   f"hydra.run.dir={tmp_path / f'h{attempt}'}")

    rng = random.Random(28)
    signals = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]
    outcomes = []
    for attempt in range(12):
        signum = signals[attempt % 3]
        process = subprocess.Popen(command(attempt), cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        # A signal before the interpreter runs main.py's first line meets the OS default (-signum); the start-up
        # window is tested on its own (test_errors.py), so the clock starts once Hydra has made the run folder.
        while process.poll() is None and not (tmp_path / f"h{attempt}").exists():
            time.sleep(0.01)
        try:
            process.communicate(timeout=rng.uniform(0.0, 5.5))
        except subprocess.TimeoutExpired:
            process.send_signal(signum)
        stdout, stderr = communicate(process)
        both = stdout + stderr
        assert "Traceback" not in both and "never retrieved" not in both and "asyncio" not in both, both[-3000:]
        if signum == signal.SIGKILL:
            assert process.returncode in (0, -signal.SIGKILL), both[-3000:]
        else:
            assert process.returncode in (0, 128 + signum), both[-3000:]
            if process.returncode:
                said = [line for line in stderr.splitlines() if "interrupted (" in line]
                assert len(said) == 1 and said[0].startswith("regen: interrupted ("), stderr[-3000:]
                read_jsonl(output)  # whole lines only
        done = len({row["primary_id"] for row in read_jsonl(output)}) if signum != signal.SIGKILL else None
        outcomes.append((signal.Signals(signum).name, process.returncode, done))
    assert any(code for _, code, _ in outcomes)  # the loop did interrupt runs
    final = subprocess.run(command(99), cwd=REPO_ROOT, capture_output=True, text=True)
    assert final.returncode == 0 and "Traceback" not in final.stderr, final.stderr[-3000:]
    counts = Counter(row["primary_id"] for row in read_jsonl(output))
    assert counts == {f"k{i}": 2 for i in range(count)}, outcomes
    assert sorted(row["id"] for row in read_jsonl(output)) == sorted(f"k{i}_gen{k}" for i in range(count)
                                                                     for k in (0, 1))
    assert read_jsonl(tmp_path / "out.errors.jsonl") == []
    print("kill loop:", outcomes)
