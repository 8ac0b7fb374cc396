"""``run(cfg)``: one regen job from a composed config to the output, error and summary files."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Any

import aiohttp
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from opd.atomic_write import atomic_write_json
from regen.chat_client import ChatClient, RetryPolicy
from regen.detokenizer import load_detokenizer
from regen.endpoint_pool import EndpointPool
from regen.output_files import (
    LineAppender,
    OutputPaths,
    ResumeState,
    compact_errors,
    repair_and_scan,
    sanitize_name,
)
from regen.pipeline import Pipeline
from regen.progress_view import ProgressView
from regen.regenerate import RequestShape
from regen.request_params import RequestParams
from regen.row_formats import check_format
from regen.row_sources import open_records
from regen.run_stats import RunStats
from regen.servers import provide_endpoints


def _check_settings(cfg: DictConfig) -> None:
    """Refuse out-of-range settings before anything starts, naming the key."""
    rules = {  # key: (integers only, smallest allowed, smallest excluded)
        "max_tokens": (True, 1, False), "concurrency": (True, 1, False), "endpoint_max_failures": (True, 1, False),
        "max_retries": (True, 0, False), "mix_seed": (True, None, False),
        "request_timeout_s": (False, 0, True), "endpoint_reprobe_s": (False, 0, True), "progress_log_s": (False, 0, True),
        "retry_backoff_s": (False, 0, False), "max_backoff_s": (False, 0, False), "all_endpoints_down_wait_s": (False, 0, False),
    }
    for key, (integer, low, exclusive) in rules.items():
        value = cfg[key]
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or (
                low is not None and (value <= low if exclusive else value < low)):
            wanted = ("an integer" if integer else "a number") + ("" if low is None else f" {'>' if exclusive else '>='} {low}")
            raise ValueError(f"{key} must be {wanted}, got {value!r}")
    if cfg.limit is not None and (isinstance(cfg.limit, bool) or not isinstance(cfg.limit, int) or cfg.limit < 0):
        raise ValueError(f"limit must be null or an integer >= 0, got {cfg.limit!r}")
    check_format(cfg.dataset.format, cfg.dataset.name or cfg.dataset.path)


def _request_headers(api_key_env: str | None) -> dict[str, str]:
    if not api_key_env:
        return {}
    key = os.environ.get(api_key_env)
    if not key:
        raise ValueError(f"api_key_env={api_key_env}: that environment variable is not set")
    return {"Authorization": f"Bearer {key}"}


def _multirun_suffix() -> str:
    """In a Hydra multirun, a name part from this job's overrides (so every job writes its own file)."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra_cfg = HydraConfig.get()
    except (ImportError, ValueError):
        return ""
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return ""
    return "_" + sanitize_name(hydra_cfg.job.override_dirname or f"job{hydra_cfg.job.num}")


def output_paths(cfg: DictConfig, model: str) -> OutputPaths:
    """``cfg.output``, else ``{output_dir}/{dataset name or file stem}_{model}[_{multirun overrides}].jsonl``."""
    if cfg.output:
        return OutputPaths(Path(cfg.output))
    source = cfg.dataset.name or Path(str(cfg.dataset.path)).stem
    model_short = model.rstrip("/").split("/")[-1]
    return OutputPaths(Path(cfg.output_dir) / f"{sanitize_name(source)}_{sanitize_name(model_short)}{_multirun_suffix()}.jsonl")


async def _served_models(session: aiohttp.ClientSession, pool: EndpointPool, headers: dict) -> list[str]:
    """Model ids from every endpoint's ``/v1/models``; endpoints that do not answer are taken out."""
    served: list[str] = []
    timeout = aiohttp.ClientTimeout(total=30)
    for endpoint in pool.endpoints:
        try:
            async with session.get(f"{endpoint.url}/v1/models", headers=headers, timeout=timeout) as reply:
                if reply.status != 200:
                    raise RuntimeError(f"HTTP {reply.status}: {(await reply.text())[:300]}")
                data = await reply.json(content_type=None)
            ids = [str(card["id"]) for card in data["data"]]
        except Exception as error:  # noqa: BLE001 - reported per endpoint, the run goes on with the others
            endpoint.live, endpoint.taken_out = False, 1
            endpoint.last_error = f"/v1/models: {type(error).__name__}: {error}"
            continue
        served.extend(model for model in ids if model not in served)
    if not any(endpoint.live for endpoint in pool.endpoints):
        raise RuntimeError("no endpoint answers /v1/models: " + "; ".join(
            f"{e.url} ({e.last_error})" for e in pool.endpoints))
    return served


def _request_model(server_cfg: DictConfig, served: list[str]) -> str:
    wanted = server_cfg.get("model")
    if wanted and wanted in served:
        return wanted
    if wanted and server_cfg.kind == "external":
        raise ValueError(f"server.model={wanted!r} is not served by the endpoints (they serve {served})")
    if not served:
        raise RuntimeError("the endpoints' /v1/models lists no model")
    return served[0]


def _open_output(paths: OutputPaths, resume: bool) -> tuple[ResumeState, frozenset[str]]:
    """Resume state and the error-file ids to watch; refuses to append to a previous run without resume."""
    if not resume:
        for path in (paths.output, paths.errors):
            if path.is_file() and path.stat().st_size:
                raise FileExistsError(f"{path} exists from an earlier run: pass resume=true to continue it, "
                                      "or choose another output / remove the old files")
        return ResumeState(), frozenset()
    state = repair_and_scan(paths.output)
    return state, frozenset(compact_errors(paths.errors, state.done_ids, drop_input_errors=True))


def _print_summary(console: Console, summary: dict[str, Any], paths: OutputPaths) -> None:
    console.print(f"[bold]regen {summary['status']}[/]: {summary['conversations_done']} conversations "
                  f"({summary['conversations_truncated']} truncated), {summary['rows_written']} rows -> {paths.output}")
    console.print(f"  failed {summary['conversations_failed']}, input errors {summary['input_errors']}, "
                  f"{summary['errors_file_rows']} rows in {paths.errors}")
    console.print(f"  {summary['requests_per_s']} req/s, {summary['completion_tokens_per_s']} tok/s, "
                  f"{summary['elapsed_s']} s; summary: {paths.summary}")
    for url, counts in summary["endpoints"].items():
        console.print(f"  {url}: {counts['requests']} requests, {counts['failures']} failures, "
                      f"{counts['conversations']} conversations{'' if counts['live'] else ' (taken out)'}")


async def _run_async(cfg: DictConfig, urls: list[str], console: Console) -> dict[str, Any]:
    records = open_records(cfg.dataset)
    headers = _request_headers(cfg.api_key_env)
    pool = EndpointPool(urls, cfg.endpoint_max_failures)
    plain = {key: OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
             for key in ("sampling", "extra_request_params", "reasoning_effort_weights", "temperature_weights")}
    params = RequestParams(plain["sampling"], plain["extra_request_params"], plain["reasoning_effort_weights"],
                           plain["temperature_weights"], cfg.mix_seed)
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        served = await _served_models(session, pool, headers)
        model = _request_model(cfg.server, served)
        detokenizer = load_detokenizer([cfg.tokenizer, cfg.server.get("model"), model])
        paths = output_paths(cfg, model)
        resume_state, previous_error_ids = _open_output(paths, cfg.resume)
        stats = RunStats()
        client = ChatClient(session, pool, RetryPolicy(cfg.max_retries, cfg.retry_backoff_s, cfg.max_backoff_s),
                            cfg.request_timeout_s, cfg.all_endpoints_down_wait_s, random.Random())
        console.print(f"regen: {model} on {', '.join(urls)}; dataset {cfg.dataset.name or cfg.dataset.path}; "
                      f"output {paths.output}" + (f" (resuming: {len(resume_state.done_ids)} done)" if cfg.resume else ""))
        output, errors = LineAppender(paths.output), LineAppender(paths.errors)
        view = ProgressView(stats, lambda: sum(e.requests for e in pool.endpoints), cfg.limit, console,
                            cfg.progress_log_s)
        pipeline = Pipeline(records, cfg.dataset.format, client, RequestShape(model, cfg.max_tokens, cfg.carry_reasoning),
                            params, detokenizer, output, errors, stats, view, resume_state.done_ids,
                            cfg.concurrency, cfg.limit, cfg.language_filter, previous_error_ids)
        probe = asyncio.create_task(pool.probe_dead(session, cfg.endpoint_reprobe_s, headers))
        status = "interrupted"
        try:
            with view:
                await pipeline.run()
            if pipeline.stopped:
                raise RuntimeError(f"regen stopped early: {pipeline.stopped}")
            status = "completed"
        except Exception as error:
            status = f"failed: {type(error).__name__}: {error}"
            raise
        finally:
            probe.cancel()
            output.close()
            errors.close()
            remaining_errors = compact_errors(paths.errors, pipeline.recovered_ids)
            summary = {
                "status": status,
                "model": model,
                "endpoints_given": urls,
                "dataset": OmegaConf.to_container(cfg.dataset, resolve=True),
                "output": str(paths.output),
                "errors_file": str(paths.errors),
                "errors_file_rows": len(remaining_errors),
                "resumed": bool(cfg.resume),
                "resume_dropped_partial_rows": resume_state.dropped_rows,
                "resume_dropped_bytes": resume_state.dropped_bytes,
                "recovered_from_errors": len(pipeline.recovered_ids),
                **stats.summary(sum(e.requests for e in pool.endpoints), client.retries, client.retry_wait_s),
                "endpoints": pool.counts(),
                "sampling_params": params.base,
                "max_tokens": cfg.max_tokens,
                "concurrency": cfg.concurrency,
                "tokenizer": detokenizer.source,
                "tokenizer_warning": pipeline.tokenizer_warning,
            }
            atomic_write_json(paths.summary, summary)
            _print_summary(console, summary, paths)
    return summary


def run(cfg: DictConfig) -> dict[str, Any]:
    """Regenerate the configured dataset; returns the summary (also written beside the output)."""
    _check_settings(cfg)
    console = Console(stderr=True)
    with provide_endpoints(cfg.server) as urls:
        return asyncio.run(_run_async(cfg, list(urls), console))

