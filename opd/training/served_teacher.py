"""The frozen teacher behind vLLM servers (``teacher_server.endpoints``): its top-k log-probabilities of the episodes'
exact token ids. Each episode is one ``/v1/completions`` request (its ids as the prompt, ``max_tokens`` 1,
``prompt_logprobs`` k, temperature 1); the rows at its targets become its ``TopLogprobs``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import replace

from common.endpoints.api_client import ApiClient, RequestFailedError, RetryPolicy, client_session
from common.endpoints.endpoint_pool import EndpointPool
from common.endpoints.secrets import Secrets
from common.endpoints.served_models import SettingNames, pick_model, served_models
from common.logprobs import distribution_problem
from common.user_errors import UserError
from opd.config import TeacherServerConfig
from opd.episodes.episode import Episode, TopLogprobs
from opd.training.stop_and_save import StepAbandoned

NAMES = SettingNames("teacher_server.endpoints", "teacher_server.model", "teacher_server.api_key_env")
REPLY_BYTES_PER_LOGPROB = 160  # one {"id": {"logprob": x, "rank": r, "decoded_token": "..."}} entry, generously
ALL_DOWN_WAIT_S = 60.0
REPROBE_S = 10.0
STOP_POLL_S = 0.25  # how soon a waiting step sees a stop request


class TeacherServerError(UserError):
    """A teacher server that cannot score: unreachable, refusing, or answering what is not the asked scores."""


def _row(entry, position: int, width: int, vocab: int) -> tuple[list[int], list[float]]:
    """One position's ``{id: {"logprob": x, ...}}`` as ids and log-probabilities, checked."""
    if not isinstance(entry, dict) or not entry or len(entry) > width:
        raise ValueError(f"position {position}: expected up to {width} log-probabilities, got {type(entry).__name__}"
                         f"{f' of {len(entry)}' if isinstance(entry, dict) else ''}")
    ids, logprobs = [], []
    for key, value in entry.items():
        token = int(key)
        logprob = value.get("logprob") if isinstance(value, dict) else None
        if (not 0 <= token < vocab or isinstance(logprob, bool) or not isinstance(logprob, (int, float))
                or not logprob <= 1e-4):
            raise ValueError(f"position {position}: id {key} with log-probability {logprob!r}")
        ids.append(token)
        logprobs.append(float(logprob))
    problem = distribution_problem(ids, logprobs)
    if problem:
        raise ValueError(f"position {position}: {problem}")
    return ids, logprobs


def top_logprobs(data, episode: Episode, k: int, vocab: int) -> TopLogprobs:
    """The ``TopLogprobs`` of ``episode``'s targets from a completions reply with ``prompt_logprobs``."""
    choices = data.get("choices") if isinstance(data, dict) else None
    rows = choices[0].get("prompt_logprobs") if choices and isinstance(choices[0], dict) else None
    if not isinstance(rows, list) or len(rows) != len(episode.ids):
        raise ValueError(f"prompt_logprobs has {len(rows) if isinstance(rows, list) else 'no'} positions for a "
                         f"prompt of {len(episode.ids)} ids")
    ids, logprobs, following = [], [], []
    mask = episode.target_mask()
    for position, (token, target) in enumerate(zip(episode.ids, mask, strict=True)):
        if not target:
            continue
        row_ids, row_logprobs = _row(rows[position], position, k + 1, vocab)
        if token not in row_ids:
            raise ValueError(f"position {position}: the prompt's own id {token} is missing (another tokenizer?)")
        following.append(row_logprobs[row_ids.index(token)])
        ids.append(row_ids)
        logprobs.append(row_logprobs)
    return TopLogprobs.from_rows(ids, logprobs, following)


class ServedTeacher:
    """Scores episodes on the teacher servers; ``close`` when done. Built before any compute: refuses a served model
    whose ``max_model_len`` is below ``max_total_len``."""

    def __init__(self, settings: TeacherServerConfig, *, max_total_len: int, vocab: int):
        self.settings, self.vocab = settings, vocab
        self.loop = asyncio.new_event_loop()
        api_key = os.environ.get(settings.api_key_env) if settings.api_key_env else None  # checked by the config
        self.secrets = Secrets(api_key, settings.endpoints)
        self.pool = EndpointPool(list(settings.endpoints), concurrency=settings.concurrency)
        try:
            served = self.loop.run_until_complete(served_models(settings.api_key_env, self.pool, self.secrets, NAMES))
            self.model = pick_model(served, settings.model, must_serve_wanted=True, names=NAMES)
            limit = served.get(self.model)
            if limit is not None and limit < max_total_len:
                raise TeacherServerError(f"the teacher server's max_model_len {limit} is below rollout.max_total_len="
                                         f"{max_total_len}", "serve it with a larger --max-model-len")
        except BaseException:
            self.loop.close()
            raise
        self.session = self.loop.run_until_complete(self._session())
        self.client = ApiClient(
            self.session, self.pool, RetryPolicy(settings.max_retries), settings.request_timeout_s, ALL_DOWN_WAIT_S,
            max_reply_bytes=(1 << 20) + max_total_len * (settings.top_logprobs + 1) * REPLY_BYTES_PER_LOGPROB,
            secrets=self.secrets, limit_hint="rollout.max_total_len and teacher_server.top_logprobs bound it")

    async def _session(self):
        return client_session(self.settings.api_key_env)

    def score(self, episodes: list[Episode], stop: Callable[[], bool] = lambda: False) -> list[Episode]:
        """``episodes`` with their targets' ``teacher_top``, up to ``teacher_server.concurrency`` requests at once;
        raises ``StepAbandoned`` within ``STOP_POLL_S`` once ``stop()`` is true (a signal while a server hangs)."""
        return self.loop.run_until_complete(self._score_all(episodes, stop))

    async def _score_all(self, episodes: list[Episode], stop: Callable[[], bool]) -> list[Episode]:
        probe = asyncio.ensure_future(self.pool.probe_dead(self.session, REPROBE_S))
        scoring = asyncio.ensure_future(asyncio.gather(*(self._score(episode) for episode in episodes)))
        try:
            while not (await asyncio.wait({scoring}, timeout=STOP_POLL_S))[0]:
                if stop():
                    raise StepAbandoned("stopped while the teacher servers had not answered")
            return list(scoring.result())
        finally:
            for task in (probe, scoring):
                task.cancel()
            await asyncio.gather(probe, scoring, return_exceptions=True)

    async def _score(self, episode: Episode) -> Episode:
        k = self.settings.top_logprobs
        payload = {"model": self.model, "prompt": episode.ids, "max_tokens": 1, "temperature": 1.0,
                   "prompt_logprobs": k}
        affinity = await self.pool.claim()
        try:
            reply = await self.client.complete(payload, affinity, completions=True)
        except RequestFailedError as error:
            raise TeacherServerError(f"the teacher server could not score {episode.record.source}: {error}") from None
        finally:
            self.pool.release(affinity)
        try:
            top = top_logprobs(reply.data, episode, k, self.vocab)
        except (ValueError, TypeError, AttributeError) as error:
            raise TeacherServerError(f"{reply.endpoint} answered {episode.record.source} with unusable "
                                     f"prompt_logprobs: {self.secrets.redact(str(error))}") from None
        return replace(episode, teacher_top=top)

    def close(self) -> None:
        self.loop.run_until_complete(self.session.close())
        self.loop.close()
