"""regen's output rows as fixed episodes (``mode=offline offline.source=regen_rows``), taken as they are: no chat
template, no re-tokenizing.

A row (speculators' format, as ``onpolicy-regen`` writes it) holds ``input_ids`` and a ``loss_mask`` of the same
length: 0 over the prompt, 1 over each generated span, which become the episode's target turns. A row whose
``metadata.finish_reason`` is ``length`` was cut at ``max_tokens``: its last turn counts as cut at ``max_gen_len``
(a broken turn, which ``loss.mask_broken_turns`` leaves out).
"""

from __future__ import annotations

from pathlib import Path

from common.chat_records import AgentRecord, RecordError, read_rows
from common.logprobs import distribution_problem
from common.run_log import show
from opd.episodes.episode import ANSWER, MAX_GEN_LEN, Episode, TopLogprobs, Turn


def _ints(row: dict, key: str, source: str, low: int, high: int) -> list[int]:
    values = row.get(key)
    if not isinstance(values, list) or not values:
        raise RecordError(f"{source}: '{key}' must be a non-empty list of integers (a row onpolicy-regen writes)")
    for position, value in enumerate(values):
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value < high:
            raise RecordError(f"{source}: {key}[{position}] is {value!r}, not an integer in [{low}, {high})")
    return values


def row_episode(row, source: str, vocab: int, *, with_logprobs: bool = False) -> Episode:
    """One regen row as an episode whose targets are exactly its ``loss_mask``'s ones (``with_logprobs``: scored by
    the top-k log-probabilities regen stored in the row)."""
    if not isinstance(row, dict):
        raise RecordError(f"{source}: expected a JSON object with input_ids and loss_mask, got {type(row).__name__}")
    ids = _ints(row, "input_ids", source, 0, vocab)
    mask = _ints(row, "loss_mask", source, 0, 2)
    if len(mask) != len(ids):
        raise RecordError(f"{source}: loss_mask has {len(mask)} entries for {len(ids)} input_ids")
    if mask[0]:
        raise RecordError(f"{source}: loss_mask[0] is 1, but the first id has no context to be predicted from")
    turns, start = [], None
    for position, flag in enumerate([*mask, 0]):
        if flag and start is None:
            start = position
        elif not flag and start is not None:
            turns.append(Turn(start, position))
            start = None
    if not turns:
        raise RecordError(f"{source}: loss_mask holds no 1: nothing to train on")
    metadata = row.get("metadata")
    cut = isinstance(metadata, dict) and metadata.get("finish_reason") == "length"
    record = AgentRecord(messages=[], tools=None, source=source)
    episode = Episode(record, turns[0].start, list(ids), turns, stop_reason=MAX_GEN_LEN if cut else ANSWER)
    if with_logprobs:
        episode.teacher_top = stored_logprobs(row, source, ids, mask, vocab)
    return episode


def stored_logprobs(row: dict, source: str, ids: list[int], mask: list[int], vocab: int) -> TopLogprobs:
    """The row's ``top_logprobs`` (``onpolicy-regen top_logprobs=k``) as the teacher's scores of its targets."""
    stored = row.get("top_logprobs")
    if not isinstance(stored, dict):
        raise RecordError(f"{source}: no top_logprobs (write the rows with onpolicy-regen top_logprobs=K, or set "
                          "offline.row_logprobs=false to score them with a teacher)")
    targets = [token for token, flag in zip(ids, mask, strict=True) if flag]
    top_ids, top_logprobs, own = (stored.get(key) for key in ("ids", "logprobs", "token_logprobs"))
    if not all(isinstance(value, list) and len(value) == len(targets) for value in (top_ids, top_logprobs, own)):
        raise RecordError(f"{source}: top_logprobs.ids, .logprobs and .token_logprobs must hold one entry per "
                          f"loss_mask 1 ({len(targets)})")
    rows_ids, rows_logprobs = [], []
    for position, (token, entry_ids, entry_logprobs, logprob) in enumerate(zip(targets, top_ids, top_logprobs, own,
                                                                              strict=True)):
        where = f"{source}: top_logprobs entry {position}"
        if not (isinstance(entry_ids, list) and isinstance(entry_logprobs, list) and entry_ids
                and len(entry_ids) == len(entry_logprobs)):
            raise RecordError(f"{where}: ids and logprobs must be lists of the same length")
        numbers = [*entry_logprobs, logprob]
        if any(isinstance(x, bool) or not isinstance(x, (int, float)) or not x <= 1e-4 for x in numbers):
            raise RecordError(f"{where}: log-probabilities must be numbers <= 0")
        if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < vocab for i in entry_ids):
            raise RecordError(f"{where}: ids must be integers in [0, {vocab})")
        extra = token not in entry_ids  # the sampled id outside the top-k: its own slot, as a server gives it
        rows_ids.append([*entry_ids, token] if extra else list(entry_ids))
        rows_logprobs.append([float(x) for x in ([*entry_logprobs, logprob] if extra else entry_logprobs)])
        problem = distribution_problem(rows_ids[-1], rows_logprobs[-1], token, float(logprob))
        if problem:
            raise RecordError(f"{where}: {problem}")
    return TopLogprobs.from_rows(rows_ids, rows_logprobs, [float(x) for x in own])


def load_token_rows(path: str | Path, *, vocab: int, max_total_len: int, drop_too_long: bool,
                    with_logprobs: bool = False) -> tuple[list[Episode], str]:
    """The rows of ``path`` as episodes and the file's sha256. A row longer than ``max_total_len`` is an error, or
    with ``drop_too_long`` left out and counted in the run log."""
    rows, sha256 = read_rows(path)
    episodes, dropped = [], []
    for row, source in rows:
        episode = row_episode(row, source, vocab, with_logprobs=with_logprobs)
        if len(episode.ids) > max_total_len:
            if not drop_too_long:
                raise RecordError(f"{source}: the row is {len(episode.ids)} tokens, over rollout.max_total_len="
                                  f"{max_total_len} (fixed sequences are never truncated; or offline.drop_too_long)")
            dropped.append(source)
            continue
        episodes.append(episode)
    if not episodes:
        raise RecordError(f"{path}: every row is over rollout.max_total_len={max_total_len}")
    if dropped:
        show(f"left out {len(dropped)} of {len(rows)} rows over rollout.max_total_len={max_total_len} "
             f"(offline.drop_too_long): {', '.join(dropped[:3])}{', ...' if len(dropped) > 3 else ''}")
    return episodes, sha256
