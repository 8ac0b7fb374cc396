"""regen's main loop: source records -> conversations -> one task each, as the endpoint pool has room -> output.

A producer reads the source in chunks (in a thread) into a bounded queue; a dispatcher starts each conversation
once ``EndpointPool.claim`` gives room. A failed conversation goes to the error file; any other error stops the run.
The first row with an id claims it: a later duplicate becomes an error row, so no id is in both files. Once every
endpoint is given up on, no more conversations start (they are left for resume).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from common.endpoints.api_client import OutOfFileDescriptorsError, Retries, out_of_descriptors
from common.endpoints.endpoint_pool import Affinity
from regen.conversations.regenerate import ConversationFailed, Regeneration
from regen.outputs.output_files import IdIndex
from regen.outputs.run_output import RunOutput
from regen.outputs.run_stats import RunStats
from regen.rows.conversation import Conversation, RowError
from regen.rows.formats import to_conversation
from regen.rows.sources import Source, SourceRecord

CHUNK = 256
ALL_DOWN = "every endpoint is down; conversations not started yet are left for resume=true"


@dataclass(frozen=True)
class SourceRows:
    """The rows a run reads: its source, their format, the language filter and the limit (rows past the filter)."""

    source: Source
    format_name: str
    limit: int | None
    language_filter: str | None

    def eligible(self, stats: RunStats) -> Iterator[SourceRecord]:
        """Source records that pass the language filter (the others counted in ``stats``), up to ``limit``."""
        passed = (record for record in self.source.records() if self._passes(record, stats))
        return itertools.islice(passed, self.limit)

    def count(self) -> int | None:
        """How many records :meth:`eligible` yields as far as known beforehand (with a language filter only the
        limit, an upper bound); ``None`` when unknown."""
        size = None if self.language_filter is not None else self.source.size()
        return min((count for count in (size, self.limit) if count is not None), default=None)

    def _passes(self, record: SourceRecord, stats: RunStats) -> bool:
        if self.language_filter is None or (isinstance(record.row, dict)
                                            and record.row.get("language") == self.language_filter):
            return True
        stats.skipped_language += 1
        return False


class Pipeline:
    """One run's conversations from ``rows`` through ``regeneration`` into ``output``; :meth:`run` drives it to the
    end of the source (or the limit)."""

    def __init__(self, rows: SourceRows, regeneration: Regeneration, output: RunOutput, stats: RunStats,
                 warn: Callable[[str], None]):
        self.rows, self.regeneration, self.output, self.stats, self.warn = rows, regeneration, output, stats, warn
        self.client = regeneration.client
        self.first_seen = IdIndex()  # primary id -> idx of the row that claimed it
        self._tokenizer_checked = False
        self._conversations: set[asyncio.Task] = set()
        self._fatal: asyncio.Future | None = None  # the first error that stops the run

    def _record_error(self, key: str, idx: int, where: str, error: str, stage: str,
                      generations_completed: int = 0, endpoint: str | None = None) -> None:
        if self.stats.first_failure is None:
            self.stats.first_failure = error if error.startswith(where) else f"{where}: {error}"
        self.output.errors.append([{"id": key, "metadata": {
            "idx": idx, "error": error, "generations_completed": generations_completed,
            "endpoint": endpoint, "source": where, "stage": stage}}])

    def _admit(self, record: SourceRecord) -> Conversation | None:
        """The conversation to regenerate for this record, or ``None`` when it is skipped or rejected."""
        if record.error is not None:
            self.stats.input_errors += 1
            self._record_error(record.where, record.idx, record.where, record.error, "input")
            return None
        key = record.primary_id
        if key is not None:
            first = self.first_seen.get(key)
            if first is not None:
                self.stats.input_errors += 1
                self.stats.duplicate_ids += 1
                self._record_error(record.where, record.idx, record.where,
                                   f"{record.where}: id {key!r} was already used by {self.rows.source.locate(first)}; "
                                   "only that row is regenerated (give this one its own id)", "input")
                return None
            self.first_seen.add(key, record.idx)
        try:
            conversation = to_conversation(record.row, self.rows.format_name, record.idx, key or record.where)
        except RowError as error:
            self.stats.input_errors += 1
            self._record_error(key or record.where, record.idx, record.where, f"{record.where}: {error}", "input")
            return None
        if key in self.output.resume.done_ids:
            self.stats.skipped_done += 1
            return None
        return conversation

    async def _produce(self, queue: asyncio.Queue) -> None:
        eligible = self.rows.eligible(self.stats)
        while not self.stats.stopped and (
                chunk := await asyncio.to_thread(lambda: list(itertools.islice(eligible, CHUNK)))):
            for record in chunk:
                if self.client.gave_up_on_endpoints:
                    self.stats.stopped = ALL_DOWN
                    break
                conversation = self._admit(record)
                if conversation is not None:
                    await queue.put((conversation, record.where))
        await queue.put(None)

    async def _regenerate_one(self, conversation: Conversation, where: str, affinity: Affinity) -> None:
        try:
            outcome = await self.regeneration.conversation(conversation, affinity)
        except ConversationFailed as failure:
            self._count_retries(failure.retries)
            self.stats.failed += 1
            self._record_error(conversation.primary_id, conversation.idx, where, str(failure), "generation",
                               failure.generations_completed, failure.endpoint)
            return
        self.output.rows.append(outcome.rows)
        self._count_retries(outcome.retries)
        self.stats.done += 1
        self.stats.rows += len(outcome.rows)
        self.stats.prompt_tokens += outcome.prompt_tokens
        self.stats.completion_tokens += outcome.completion_tokens
        self.stats.reasoning_corrected += outcome.reasoning_corrected
        if outcome.other_model_replies and not self.stats.other_model_replies:
            # the name is the server's text, never printed: a hostile server could echo a secret in it
            self.warn(f"replies name another model than the requests' {self.regeneration.shape.model} (vLLM echoes "
                      "the served name): the endpoint may serve another model; the summary counts them "
                      "(replies_naming_other_models)")
        self.stats.other_model_replies += outcome.other_model_replies
        if outcome.truncation:
            self.stats.truncated[outcome.truncation] += 1
        if conversation.primary_id in self.output.previous_error_ids:
            self.stats.recovered_ids.add(conversation.primary_id)
        if not self._tokenizer_checked:
            self._tokenizer_checked = True
            self._check_tokenizer(conversation, outcome.rows[0]["text"])

    def _count_retries(self, retries: Retries) -> None:
        self.stats.retries += retries.count
        self.stats.retry_wait_s += retries.wait_s

    def _check_tokenizer(self, conversation: Conversation, text: str) -> None:
        """Warn once when the decoded prompt does not contain the user's words (likely a wrong tokenizer)."""
        first_user = next(turn["content"] for turn in conversation.turns if turn["role"] == "user")
        if first_user.strip() not in text:
            self.stats.tokenizer_warning = (
                f"the first row's decoded text does not contain its user message: tokenizer "
                f"{self.regeneration.detokenizer.source} may not be the served model's (row text would be wrong)")
            self.warn(self.stats.tokenizer_warning)

    async def _converse(self, conversation: Conversation, where: str, affinity: Affinity) -> None:
        """One conversation's task: its room is given back however it ends; an error other than a failed
        conversation becomes the run's."""
        try:
            await self._regenerate_one(conversation, where, affinity)
        except Exception as error:  # noqa: BLE001 - handed to run(), which raises it
            if not self._fatal.done():
                self._fatal.set_exception(error)
        finally:
            self.client.pool.release(affinity)
            self._conversations.discard(asyncio.current_task())

    async def _dispatch(self, queue: asyncio.Queue) -> None:
        """Start each queued conversation as soon as the pool has room for it; return when all are done."""
        pool = self.client.pool
        while (item := await queue.get()) is not None:
            affinity = await pool.claim()
            if self.client.gave_up_on_endpoints:  # not started: left for resume, like the rows not read
                pool.release(affinity)
                self.stats.stopped = ALL_DOWN
                continue
            self._conversations.add(asyncio.create_task(self._converse(*item, affinity)))
        while self._conversations:
            await asyncio.wait(self._conversations)

    async def run(self) -> None:
        """Regenerate every admitted conversation; a fatal error cancels the rest and propagates. However it ends,
        every task it started is cancelled, awaited and its error retrieved before it returns."""
        fatal = self._fatal = asyncio.get_running_loop().create_future()
        queue: asyncio.Queue = asyncio.Queue(maxsize=CHUNK)
        produce = asyncio.create_task(self._produce(queue))
        dispatch = asyncio.create_task(self._dispatch(queue))
        try:
            waiting = {produce, dispatch, fatal}
            while not dispatch.done() and not fatal.done():
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for task in done - {fatal}:
                    task.result()  # an error reading the source ends the run
            if fatal.done():
                fatal.result()
            dispatch.result()
        except OSError as error:  # no file descriptor left for reading the source or writing: the same as connecting
            if out_of_descriptors(error):
                raise OutOfFileDescriptorsError("regenerating conversations") from None
            raise
        finally:
            pending = [produce, dispatch, *self._conversations]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if not fatal.done():
                fatal.cancel()
            elif not fatal.cancelled():
                fatal.exception()  # retrieved, also when it came while the rest was being cancelled
