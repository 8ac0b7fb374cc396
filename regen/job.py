"""``run(cfg)``: one regen job, from a composed config to the output, error, summary and manifest files.

Settings, dataset and output are checked before any server starts. Ctrl-C/SIGTERM stop the run between requests
(finished conversations stay; the summary says ``interrupted``); a full disk ends it with one ``error:`` line.
"""

from __future__ import annotations

import asyncio
import errno
import os
from typing import Any

from rich.console import Console
from rich.markup import escape

from common.atomic_write import atomic_write_json
from common.endpoints.api_client import ApiClient, RetryPolicy, client_session, out_of_descriptors
from common.endpoints.endpoint_pool import EndpointPool
from common.endpoints.secrets import Secrets
from common.endpoints.served_models import pick_model, served_models
from common.run_folders import checks_passed
from common.run_log import printable
from common.user_errors import UserError, full_disk_is_one_error
from regen.cancel_on_signal import StopSignals, stop_signals
from regen.conversations.detokenizer import Detokenizer, load_detokenizer
from regen.conversations.regenerate import Regeneration, RequestShape
from regen.conversations.request_params import RequestParams
from regen.endpoints.inflight_control import steer
from regen.outputs.hydra_runtime import multirun_overrides, scrub_credentials
from regen.outputs.output_files import compact_errors
from regen.outputs.progress_view import ProgressView, to_do
from regen.outputs.run_manifest import run_settings
from regen.outputs.run_output import open_output, output_paths
from regen.outputs.run_summary import RunState, print_summary
from regen.pipeline import Pipeline, SourceRows
from regen.rows.sources import Source, open_source
from regen.servers import provide_endpoints
from regen.settings import ExternalServer, RegenSettings, check_max_tokens_fit


class RunStoppedError(UserError):
    """The run ended before the end of the source (every endpoint down)."""


REGEN_DISK_FULL_HINT = ("make room on that disk, then run again with resume=true (finished conversations are kept; "
                        "resume repairs the rest)")


class NothingSucceededError(UserError):
    """Every conversation this run tried failed (or every row was unusable): the run is a failure."""


def run(cfg) -> dict[str, Any]:
    """Regenerate the configured dataset; returns the summary (also written beside the output)."""
    with full_disk_is_one_error(REGEN_DISK_FULL_HINT):
        return _run(cfg)


def _run(cfg) -> dict[str, Any]:
    settings = RegenSettings.from_config(cfg)
    scrub_credentials()
    console = run_console()
    warn = warner(console)
    source = open_source(settings.dataset, warn=warn)
    with stop_signals() as signals:
        pool = EndpointPool(list(settings.server.endpoints), settings.endpoint_max_failures,
                            settings.fixed_concurrency, settings.concurrency_start)
        # the output is named after the model: the settings name it, or else the external endpoints do
        model = settings.served_model or served_model(settings, pool, signals)
        candidates = [getattr(settings.server, key, None) for key in ("tokenizer", "model")]
        detokenizer = load_detokenizer([*candidates, model], explicit=settings.tokenizer)
        paths = output_paths(settings, model, multirun_overrides())
        current = run_settings(settings, source.fingerprint, model, detokenizer.fingerprint)
        # checked and locked before any server starts, held to the end
        with open_output(settings, paths, current, warn) as output, provide_endpoints(settings.server):
            if settings.served_model:  # the server is up: it serves the model, and max_tokens fits its context
                model = served_model(settings, pool, signals)
            checks_passed()  # from here on a failure keeps the run's folders (common.run_folders)
            state = RunState(settings, model, output, detokenizer.source)
            announce(state, pool, console)
            ending: BaseException | None = None
            try:
                asyncio.run(regenerate_dataset(state, pool, source, detokenizer, signals, console))
                signals.raise_if_caught()
                check_finished(state)
                state.status = "completed"
            except BaseException as error:
                ending = error
                if isinstance(error, Exception):
                    state.status = f"failed: {type(error).__name__}: {error}"
                raise
            finally:  # interrupted, failed or completed: the summary says which
                summary = write_summary(state, pool.counts(), console, ending)
    return summary


async def regenerate_dataset(state: RunState, pool: EndpointPool, source: Source, detokenizer: Detokenizer,
                             signals: StopSignals, console: Console) -> None:
    """Every conversation of ``source`` through ``pool`` into the output, with the progress bar, the dead-endpoint
    probe and (``concurrency=auto``) in-flight steering beside it; returns at the end of the source or on a signal."""
    settings = state.settings
    asyncio.get_running_loop().set_exception_handler(unless_out_of_descriptors)
    async with client_session(settings.api_key_env) as session:
        client = ApiClient(session, pool, RetryPolicy(settings.max_retries, settings.retry_backoff_s,
                                                       settings.max_backoff_s),
                            settings.request_timeout_s, settings.all_endpoints_down_wait_s,
                            max_reply_bytes=settings.max_reply_bytes, secrets=run_secrets(settings))
        regeneration = Regeneration(client, RequestShape(state.model, settings.max_tokens, settings.carry_reasoning,
                                                              settings.top_logprobs),
                                    RequestParams.from_settings(settings), detokenizer)
        rows = SourceRows(source, settings.dataset.format, settings.limit, settings.language_filter)
        pipeline = Pipeline(rows, regeneration, state.output, state.stats, warner(console))
        view = ProgressView(state.stats, pool.endpoints, to_do(rows.count(), len(state.output.resume.done_ids)),
                            console, settings.progress_log_s)
        beside = [view.follow(), pool.probe_dead(session, settings.endpoint_reprobe_s)]
        if settings.fixed_concurrency is None:
            beside += [steer(session, pool, endpoint, settings.concurrency_max, settings.concurrency_interval_s,
                             warner(console)) for endpoint in pool.endpoints]
        tasks = [asyncio.create_task(work) for work in beside]
        try:
            with view:
                await signals.until_signal(pipeline.run())
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def unless_out_of_descriptors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """asyncio's default report of an unawaited error, except running out of file descriptors (already the run's
    own error)."""
    if not out_of_descriptors(context.get("exception")):
        loop.default_exception_handler(context)


def check_finished(state: RunState) -> None:
    """Raise :class:`RunStoppedError` when reading stopped early, :class:`NothingSucceededError` when no conversation
    succeeded although some failed, or when every row read was unusable (and none was done before)."""
    stats, errors = state.stats, state.output.paths.errors
    state.output.rows.check_in_place()  # deleted after the last block: the rows went with it
    state.output.errors.check_in_place()
    if stats.stopped:
        raise RunStoppedError(f"regen stopped early: {stats.stopped}",
                         "bring the endpoints back, then run again with resume=true")
    if stats.done or not (stats.failed or (stats.input_errors and not stats.skipped_done)):
        return
    raise NothingSucceededError(
        f"no conversation succeeded: {stats.failed} failed, {stats.input_errors} input errors; the first: "
        f"{stats.first_failure}", f"see {errors} for every one; fix the cause, then run again with resume=true")


NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)  # a folder (or disk) turned read-only


def write_summary(state: RunState, endpoints: dict[str, dict[str, Any]], console: Console,
                  ending: BaseException | None = None) -> dict[str, Any]:
    """Close the output, compact the error file, write ``<stem>.summary.json`` and print the end-of-run lines. When
    already ending on an error (``ending``), a full disk or read-only folder only costs the summary (a warning), so
    the run's own error stays the one reported."""
    state.output.close()
    paths = state.output.paths
    try:
        remaining_errors = compact_errors(paths.errors, state.stats.recovered_ids)
        summary = state.summary(len(remaining_errors), endpoints)
        atomic_write_json(paths.summary, summary)
        paths.match_output_mode(paths.summary)
    except OSError as error:
        if ending is None and error.errno in NOT_WRITABLE:
            raise UserError(f"cannot write in {paths.output.parent} ({error.strerror}): the summary is not written and "
                            f"{paths.errors.name} not compacted; the rows in {paths.output.name} are intact",
                            "make the folder writable, then run again with resume=true") from None
        if ending is None or error.errno not in (errno.ENOSPC, *NOT_WRITABLE):
            raise
        warner(console)(f"{paths.summary} not written: {error.strerror}")
        summary = state.summary(sum(1 for _ in paths.errors.open("rb")) if paths.errors.is_file() else 0, endpoints)
    print_summary(console, summary, paths)
    return summary


def announce(state: RunState, pool: EndpointPool, console: Console) -> None:
    """The run's first line (model, endpoints, dataset, output), and what resume repaired."""
    settings, paths, resume = state.settings, state.output.paths, state.output.resume
    console.print(f"regen: {escape(printable(state.model))} on {', '.join(e.url for e in pool.endpoints)}; dataset "
                  f"{escape(printable(settings.dataset.label))}; output {escape(printable(str(paths.output)))}"
                  + (f" (resuming: {len(resume.done_ids)} done)" if settings.resume else ""))
    if resume.removed_duplicate_blocks:
        warner(console)(f"removed {resume.removed_duplicate_blocks} duplicate conversation blocks "
                        f"({resume.removed_duplicate_rows} rows) from {paths.output}; the first of each stays")


def run_secrets(settings: RegenSettings) -> Secrets:
    """The run's credentials (``common.endpoints.secrets``): the API key and the endpoint URLs' passwords."""
    return Secrets(os.environ.get(settings.api_key_env) if settings.api_key_env else None, settings.server.endpoints)


def run_console(file=None) -> Console:
    """The run's console on stderr (or ``file``); ``soft_wrap`` keeps a line one line off a terminal."""
    return Console(stderr=True, file=file, soft_wrap=True)


def warner(console: Console):
    """``warn(message)``: a yellow ``warning:`` line on ``console``."""
    return lambda message: console.print(f"[yellow]warning:[/] {escape(printable(message))}")


def served_model(settings: RegenSettings, pool: EndpointPool, signals: StopSignals) -> str:
    """The model the requests name, from the endpoints' ``/v1/models`` (silent endpoints are taken out); a
    ``max_tokens`` above its ``max_model_len`` is refused."""
    served = asyncio.run(signals.until_signal(served_models(settings.api_key_env, pool, run_secrets(settings))))
    signals.raise_if_caught()
    model = pick_model(served, settings.served_model, isinstance(settings.server, ExternalServer))
    if served[model] is not None:
        check_max_tokens_fit(settings.max_tokens, served[model], f"{model} on the endpoints' /v1/models")
    return model
