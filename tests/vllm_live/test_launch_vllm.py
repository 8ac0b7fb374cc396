"""``server=vllm`` against a real vLLM (``make test-vllm``; marker ``vllm``): regen starts ``vllm serve`` through
``launch/vllm.sh`` (data parallel 1 and 2), steers ``concurrency=auto`` by its ``/metrics``, and stops it: the
process group is gone, the port is free and no pid file is left. With two data-parallel ranks vLLM runs two
API-server processes, and ``/metrics`` declares its gauges without values until the engines report."""

from __future__ import annotations

import pytest

from launch.server_process import probe_health
from regen.job import run
from tests.helpers.configs import compose_config
from tests.helpers.regen_support import read_jsonl, write_jsonl
from tests.helpers.standin_vllm_cli import free_port, group_gone
from tests.vllm_live.support import (
    MAX_MODEL_LEN,
    SERVE_FLAGS,
    MetricsPoller,
    loaded_page,
    record_or_check,
    tiny_model,
    tokenizer_dir,
    unfilled_page,
    vllm_env,
)

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("dp", [1, 2])
def test_server_vllm_starts_steers_by_metrics_and_stops(tmp_path, monkeypatch, capfd, dp):
    for key, value in vllm_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    # launch/vllm.sh probes readiness every 10 s here, so the poller sees /metrics answer before any request
    # is sent: with two API servers the gauges are then declared without values.
    monkeypatch.setenv("VLLM_READY_POLL_S", "10" if dp == 2 else "2")
    port, log = free_port(), tmp_path / "vllm.log"
    data = write_jsonl(tmp_path / "rows.jsonl", [{"id": f"c{i}", "prompt": f"Count to {i}."} for i in range(24)])
    cfg = compose_config("regen", [
        "dataset=local", f"dataset.path={data}", "server=vllm", f"server.model={tiny_model()}",
        f"server.port={port}", f"server.dp={dp}", f"server.max_model_len={MAX_MODEL_LEN}", f"server.log_file={log}",
        "server.ready_timeout_s=900", f"tokenizer={tokenizer_dir()}", f"output={tmp_path / 'out.jsonl'}",
        "sampling=greedy", "max_tokens=160", "concurrency=auto", "concurrency_interval_s=0.5"], hydra_config=True)
    cfg.server.extra_args = SERVE_FLAGS
    cfg.extra_request_params = {"ignore_eos": True}
    poller = MetricsPoller(f"http://127.0.0.1:{port}")  # from before the server is up
    try:
        summary = run(cfg)
    finally:
        pages = poller.stop()
    said = capfd.readouterr().err
    (endpoint,) = summary["endpoints"].values()
    assert summary["status"] == "completed" and len(read_jsonl(tmp_path / "out.jsonl")) == 24
    assert endpoint["concurrency_control"] == "metrics", said
    assert endpoint["concurrency_control_reason"] is None and endpoint["metrics_readings_failed"] == 0
    assert "fell back" not in said and "no usable vLLM metrics" not in said
    pid = int(said.split(f"server ready at http://127.0.0.1:{port} (pid ")[1].split(",")[0])
    assert group_gone(pid) and not probe_health(f"http://127.0.0.1:{port}")
    assert not log.with_suffix(".pid").exists()
    if dp == 2:
        assert "Started 2 API server processes" in log.read_text()
        unfilled = unfilled_page(pages)  # seen unless vllm.sh's probe came within 0.05 s of the server answering
        if unfilled is not None:
            record_or_check("metrics_dp2_unfilled.txt", unfilled)
        page = loaded_page(pages)
        assert page is not None
        record_or_check("metrics_dp2_loaded.txt", page)
