"""``run(cfg)``: one regen job from a composed config to the output, error, summary and manifest files.

Everything a person can get wrong is checked before any server starts (settings, the dataset file, the
output: writable, not taken by another run, not an earlier run's without ``resume=true``, a resume with
the same settings); when the served model decides the output's name (``server=external`` without
``server.model``) the output checks run right after ``/v1/models`` answers, still before any request.
Ctrl-C and SIGTERM stop the run between requests: finished conversations stay, the summary says
``interrupted``.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.markup import escape

from common.atomic_write import atomic_write_json
from common.run_lock import OutputLock
from regen.chat_client import ChatClient, RetryPolicy
from regen.detokenizer import Detokenizer, load_detokenizer
from regen.endpoint_pool import EndpointAddress, EndpointPool
from regen.errors import Interrupted, UserError, signals_interrupt
from regen.hydra_runtime import multirun_suffix, scrub_credentials
from regen.inflight_control import steer
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
from regen.row_sources import Source, open_source
from regen.run_manifest import check_and_record, run_settings
from regen.run_stats import RunStats
from regen.servers import provide_endpoints
from regen.settings import ExternalServer, RegenSettings, check_max_tokens_fit


class EndpointsUnusable(UserError):
    """No endpoint answers, or none serves the asked model."""


class RunStopped(UserError):
    """The run ended before the end of the source (every endpoint down)."""


class NothingSucceeded(UserError):
    """Every conversation this run tried failed (or every row was unusable): the run is a failure."""


def _check_something_succeeded(stats: RunStats, pipeline: Pipeline, paths: OutputPaths) -> None:
    """Raise :class:`NothingSucceeded` when no conversation succeeded although some failed, or when every row
    read was unusable (and none was done before)."""
    if stats.done or not (stats.failed or (stats.input_errors and not stats.skipped_done)):
        return
    raise NothingSucceeded(
        f"no conversation succeeded: {stats.failed} failed, {stats.input_errors} input errors; the first: "
        f"{pipeline.first_failure}", f"see {paths.errors} for every one; fix the cause, then run again with resume=true")


def output_paths(settings: RegenSettings, model: str) -> OutputPaths:
    """``output``, else ``{output_dir}/{dataset name or file stem}_{model}[_{multirun overrides}].jsonl``."""
    if settings.output:
        return OutputPaths(Path(settings.output))
    source = settings.dataset.name or Path(settings.dataset.path).stem
    model_short = model.rstrip("/").split("/")[-1]
    name = f"{sanitize_name(source)}_{sanitize_name(model_short)}{multirun_suffix(sanitize_name)}.jsonl"
    return OutputPaths(Path(settings.output_dir) / name)


@dataclass
class RunFiles:
    """The open output of one run: its paths, what resume found, the row-text tokenizer, the appenders."""

    paths: OutputPaths
    resume_state: ResumeState
    previous_error_ids: frozenset[str]
    detokenizer: Detokenizer
    output: LineAppender
    errors: LineAppender


def _warn(console: Console, message: str) -> None:
    console.print(f"[yellow]warning:[/] {escape(message)}")


@contextmanager
def open_run(settings: RegenSettings, source: Source, model: str, console: Console) -> Iterator[RunFiles]:
    """Lock the output, refuse what must be refused, check the manifest, repair a resumed file, open it."""
    paths = output_paths(settings, model)
    lock = OutputLock(paths.lock, paths.output, job="regen",
                      hint="wait for it to finish (or stop it), or choose another output=")
    try:
        lock.acquire()
    except OSError as error:  # the folder cannot be made or written
        raise UserError(f"cannot write the output {paths.output} ({error.strerror or error})",
                        "choose another output= or output_dir=") from None
    try:
        if not settings.resume:
            for path in (paths.output, paths.errors):
                if path.is_file() and path.stat().st_size:
                    raise UserError(f"{path} exists from an earlier run",
                                    "pass resume=true to continue it, or choose another output= (or remove the old files)")
        detokenizer = load_detokenizer([settings.tokenizer, getattr(settings.server, "model", None), model])
        output = LineAppender(paths.output)  # created first: the siblings copy its permissions
        try:
            paths.match_output_mode(paths.lock)
            current = run_settings(settings, source.fingerprint, model, detokenizer.fingerprint)
            accepted = check_and_record(paths, current, resuming=settings.resume,
                                        accept_changes=settings.resume_accept_changes,
                                        warn=lambda message: _warn(console, message))
            for key, (old, new) in accepted.items():
                _warn(console, f"resume_accept_changes: {key} was {old!r}, now {new!r} (recorded in the manifest)")
            if settings.resume:
                resume_state = repair_and_scan(paths.output)
                previous = frozenset(compact_errors(paths.errors, resume_state.done_ids, drop_input_errors=True))
            else:
                resume_state, previous = ResumeState(), frozenset()
            errors = LineAppender(paths.errors)
            paths.match_output_mode(paths.errors)
        except BaseException:
            output.close()
            raise
        try:
            yield RunFiles(paths, resume_state, previous, detokenizer, output, errors)
        finally:
            output.close()
            errors.close()
    finally:
        lock.release()


def _bearer_headers(api_key_env: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {os.environ[api_key_env]}"} if api_key_env else {}


async def _served_models(session: aiohttp.ClientSession, pool: EndpointPool) -> dict[str, int | None]:
    """Model id -> ``max_model_len`` (the smallest any endpoint reports; None when none does) from every
    endpoint's ``/v1/models``; endpoints that do not answer are taken out."""
    served: dict[str, int | None] = {}
    timeout = aiohttp.ClientTimeout(total=30)
    for endpoint in pool.endpoints:
        try:
            async with session.get(endpoint.address.base + "/v1/models", headers=endpoint.headers,
                                   timeout=timeout) as reply:
                if reply.status != 200:
                    hint = " (the server wants an API key: set api_key_env=)" if reply.status == 401 else ""
                    raise RuntimeError(f"HTTP {reply.status}{hint}: {(await reply.text())[:300]}")
                data = await reply.json(content_type=None)
            cards = [(str(card["id"]), card.get("max_model_len")) for card in data["data"]]
        except Exception as error:  # noqa: BLE001 - reported per endpoint, the run goes on with the others
            endpoint.live, endpoint.taken_out = False, 1
            endpoint.last_error = f"/v1/models: {type(error).__name__}: {error}"
            continue
        for model, length in cards:
            known = served.get(model)
            if isinstance(length, int) and not isinstance(length, bool) and length > 0:
                served[model] = length if known is None else min(known, length)
            else:
                served.setdefault(model, known)
    if not any(endpoint.live for endpoint in pool.endpoints):
        raise EndpointsUnusable("no endpoint answers /v1/models: " + "; ".join(
            f"{e.url} ({e.last_error})" for e in pool.endpoints),
            "start the server, or check server.endpoints (and api_key_env)")
    return served


def _request_model(settings: RegenSettings, served: dict[str, int | None]) -> str:
    """The model the requests name; refuses a ``max_tokens`` above its ``max_model_len``."""
    model = _served_model(settings, list(served))
    if served[model] is not None:
        check_max_tokens_fit(settings.max_tokens, served[model], f"{model} on the endpoints' /v1/models")
    return model


def _served_model(settings: RegenSettings, served: list[str]) -> str:
    wanted = settings.served_model
    if wanted and wanted in served:
        return wanted
    if wanted and isinstance(settings.server, ExternalServer):
        raise EndpointsUnusable(f"server.model={wanted!r} is not served by the endpoints (they serve {served})",
                                "drop server.model to use what they serve, or point server.endpoints elsewhere")
    if not served:
        raise EndpointsUnusable("the endpoints' /v1/models lists no model")
    return served[0]


def _print_summary(console: Console, summary: dict[str, Any], paths: OutputPaths) -> None:
    failed = summary["conversations_failed"]
    status = summary["status"]
    headline = "red" if failed or status != "completed" else "green"
    console.print(f"[bold {headline}]regen {escape(status.split(':')[0])}[/]: {summary['conversations_done']} conversations done, "
                  + (f"[bold red]{failed} FAILED[/]" if failed else "0 failed")
                  + f", {summary['conversations_truncated']} truncated; {summary['rows_written']} rows -> "
                  f"{escape(str(paths.output))}")
    if failed:
        console.print(f"  [red]first failure:[/] {escape(str(summary['first_failure']))}")
    console.print(f"  input errors {summary['input_errors']} ({summary['duplicate_ids']} duplicate ids), "
                  f"{summary['errors_file_rows']} rows in {escape(str(paths.errors))}")
    console.print(f"  {summary['requests_per_s']} req/s, {summary['completion_tokens_per_s']} tok/s, "
                  f"{summary['elapsed_s']} s; summary: {escape(str(paths.summary))}")
    if summary["reasoning_split_corrected"]:
        console.print(f"  {summary['reasoning_split_corrected']} history turns took their reasoning/answer split "
                      "from the token ids, not from the server's reasoning parser (regen/README.md, reasoning models)")
    for url, counts in summary["endpoints"].items():
        console.print(f"  {url}: {counts['requests']} requests, {counts['failures']} failures, "
                      f"{counts['conversations']} conversations{'' if counts['live'] else ' (taken out)'}; "
                      f"{counts['generation_tokens_per_s']} tok/s, {counts['in_flight_mean']} in flight on average"
                      + (f", limit {counts['in_flight_limit']} (mean {counts['in_flight_limit_mean']}, "
                         f"by {counts['concurrency_control']})" if "in_flight_limit" in counts else ""))
        if counts.get("concurrency_control_reason"):
            console.print(f"    [yellow]concurrency=auto fell back to throughput:[/] "
                          f"{escape(counts['concurrency_control_reason'])}")
        if counts.get("metrics_readings_failed"):
            console.print(f"    [yellow]{counts['metrics_readings_failed']} /metrics readings failed and were "
                          f"skipped[/] (last: {escape(str(counts['metrics_last_failure']))})")
    if summary["concurrency_chosen"] is not None:
        console.print(f"  concurrency=auto settled on {summary['concurrency_chosen']} conversations in flight "
                      "(the sum of the endpoints' limits): a fixed run would set concurrency="
                      f"{summary['concurrency_chosen']}")


@contextmanager
def _signals_cancel(task: asyncio.Task, caught: list[int]) -> Iterator[None]:
    """While the block runs, SIGINT/SIGTERM cancel ``task`` (between requests, never mid-write)."""
    loop = asyncio.get_running_loop()
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}

    def cancel(signum: int) -> None:
        caught.append(signum)
        task.cancel()

    try:
        for signum in previous:
            loop.add_signal_handler(signum, cancel, signum)
    except (RuntimeError, ValueError):  # not the main thread: Python's own handling stays
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            loop.remove_signal_handler(signum)
            signal.signal(signum, handler)


async def _run_async(settings: RegenSettings, source: Source, addresses: list[EndpointAddress],
                     run_files: RunFiles | None, stack: ExitStack, console: Console) -> dict[str, Any]:
    pool = EndpointPool(addresses, settings.endpoint_max_failures, settings.fixed_concurrency, settings.concurrency_start)
    params = RequestParams.from_settings(settings)
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(connector=connector, headers=_bearer_headers(settings.api_key_env)) as session:
        model = _request_model(settings, await _served_models(session, pool))
        if run_files is None:
            run_files = stack.enter_context(open_run(settings, source, model, console))
        paths, resume_state = run_files.paths, run_files.resume_state
        stats = RunStats()
        client = ChatClient(session, pool, RetryPolicy(settings.max_retries, settings.retry_backoff_s,
                                                       settings.max_backoff_s),
                            settings.request_timeout_s, settings.all_endpoints_down_wait_s, random.Random())
        console.print(f"regen: {escape(model)} on {', '.join(e.url for e in pool.endpoints)}; dataset "
                      f"{escape(settings.dataset.label)}; output {escape(str(paths.output))}"
                      + (f" (resuming: {len(resume_state.done_ids)} done)" if settings.resume else ""))
        if resume_state.removed_duplicate_blocks:
            _warn(console, f"removed {resume_state.removed_duplicate_blocks} duplicate conversation blocks "
                           f"({resume_state.removed_duplicate_rows} rows) from {paths.output}; the first of each stays")
        view = ProgressView(stats, pool.endpoints, settings.limit, console, settings.progress_log_s)
        pipeline = Pipeline(source.records(), source.locate, settings.dataset.format, client,
                            RequestShape(model, settings.max_tokens, settings.carry_reasoning), params,
                            run_files.detokenizer, run_files.output, run_files.errors, stats, view,
                            resume_state.done_ids, settings.limit, settings.language_filter,
                            run_files.previous_error_ids)
        background = [asyncio.create_task(pool.probe_dead(session, settings.endpoint_reprobe_s))]
        if settings.fixed_concurrency is None:
            background += [asyncio.create_task(steer(session, pool, endpoint, settings.concurrency_max,
                                                     settings.concurrency_interval_s,
                                                     lambda message: _warn(console, message)))
                           for endpoint in pool.endpoints]
        work = asyncio.create_task(pipeline.run())
        caught: list[int] = []
        status = "interrupted"
        try:
            with view, _signals_cancel(work, caught):
                await work
            if pipeline.stopped:
                raise RunStopped(f"regen stopped early: {pipeline.stopped}",
                                 "bring the endpoints back, then run again with resume=true")
            _check_something_succeeded(stats, pipeline, paths)
            status = "completed"
        except asyncio.CancelledError:
            if not caught:
                raise
        except Exception as error:
            status = f"failed: {type(error).__name__}: {error}"
            raise
        finally:
            for task in background:
                task.cancel()
            run_files.output.close()
            run_files.errors.close()
            remaining_errors = compact_errors(paths.errors, pipeline.recovered_ids)
            summary = _summary(settings, status, model, pool, paths, resume_state, pipeline, stats, client, params,
                               run_files.detokenizer, len(remaining_errors))
            atomic_write_json(paths.summary, summary)
            paths.match_output_mode(paths.summary)
            _print_summary(console, summary, paths)
        if caught:
            raise Interrupted(caught[0])
    return summary


def _summary(settings: RegenSettings, status: str, model: str, pool: EndpointPool, paths: OutputPaths,
             resume_state: ResumeState, pipeline: Pipeline, stats: RunStats, client: ChatClient,
             params: RequestParams, detokenizer: Detokenizer, errors_file_rows: int) -> dict[str, Any]:
    return {
        "status": status,
        "conversations_done": stats.done,
        "conversations_failed": stats.failed,
        "first_failure": pipeline.first_failure,
        "model": model,
        "endpoints_given": [e.url for e in pool.endpoints],
        "dataset": asdict(settings.dataset),
        "output": str(paths.output),
        "errors_file": str(paths.errors),
        "manifest": str(paths.manifest),
        "errors_file_rows": errors_file_rows,
        "resumed": settings.resume,
        "resume_dropped_partial_rows": resume_state.dropped_rows,
        "resume_dropped_bytes": resume_state.dropped_bytes,
        "resume_removed_duplicate_blocks": resume_state.removed_duplicate_blocks,
        "resume_removed_duplicate_rows": resume_state.removed_duplicate_rows,
        "recovered_from_errors": len(pipeline.recovered_ids),
        **stats.summary(sum(e.requests for e in pool.endpoints), client.retries, client.retry_wait_s),
        "endpoints": pool.counts(),
        "sampling_params": params.base,
        "max_tokens": settings.max_tokens,
        "concurrency": settings.concurrency,
        "concurrency_chosen": None if settings.fixed_concurrency is not None else sum(
            e.limit for e in pool.endpoints),
        "tokenizer": detokenizer.source,
        "tokenizer_warning": pipeline.tokenizer_warning,
    }


def run(cfg) -> dict[str, Any]:
    """Regenerate the configured dataset; returns the summary (also written beside the output)."""
    settings = RegenSettings.from_config(cfg)
    scrub_credentials()
    console = Console(stderr=True)
    source = open_source(settings.dataset, warn=lambda message: _warn(console, message))
    with signals_interrupt(), ExitStack() as stack:
        run_files = None
        if settings.served_model:  # the output's name is known: check it before any server starts
            run_files = stack.enter_context(open_run(settings, source, settings.served_model, console))
        addresses = stack.enter_context(provide_endpoints(settings.server))
        return asyncio.run(_run_async(settings, source, list(addresses), run_files, stack, console))

