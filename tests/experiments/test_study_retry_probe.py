"""The teacher-forced retry probe: every trained turn of a noisy demonstration sorted by kind, and a model that
notices wrong calls told apart from one that never does."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from experiments.study.chain_task import RETRY_NOTE, make_record
from experiments.study.retry_probe import probe, turn_kinds
from opd.episodes.chat_format import ChatFormat
from opd.episodes.demonstrations import demonstration_episode, parse_demonstration
from tests.helpers.opd_support import tiny_model


@pytest.fixture(scope="module")
def demonstrations():
    rng = random.Random(1)
    rows = [make_record((start, op, 3), 4, demonstration=True, value_noise=0.4, syntax_noise=0.1,
                        operand_share=0.3, rng=rng) for start in range(8) for op in ("+", "*")]
    return [parse_demonstration(row, f"noisy.jsonl:{line}") for line, row in enumerate(rows, 1)]


class Oracle:
    """Logits that put all mass on the demonstration's own next token, except, for a model that does not notice, the
    call's first token instead of the note where a retry turn starts (``blind``: episode ids -> those positions)."""

    def __init__(self, vocab: int, call_token: int, blind: dict[tuple, list[int]] | None = None):
        self.vocab, self.call_token, self.blind = vocab, call_token, blind or {}

    def __call__(self, ids: torch.Tensor):
        following = torch.cat([ids[0, 1:], ids[0, -1:]])
        for position in self.blind.get(tuple(ids[0].tolist()), []):
            following[position] = self.call_token
        return SimpleNamespace(logits=torch.nn.functional.one_hot(following, self.vocab)[None].float() * 50)


def test_every_trained_turn_is_sorted_by_what_came_before_it(demonstrations):
    for demonstration in demonstrations:
        assistants = [m for m in demonstration.messages if m["role"] == "assistant"]
        kinds = turn_kinds(demonstration)
        assert len(kinds) == len(assistants) and kinds[-1] == "answer"
        for index, (message, kind) in enumerate(zip(assistants, kinds, strict=True)):
            if message.get("weight", 1) == 0:
                assert kind is None
            elif index and assistants[index - 1].get("weight", 1) == 0:
                assert kind.startswith("retry-") and message["content"] == RETRY_NOTE
                calls_before = sum(1 for m in assistants[:index] if m.get("weight", 1) == 1 and m.get("tool_calls"))
                assert kind.endswith("-first") == (calls_before == 0)
            else:
                assert kind in ("call", "answer") and message["content"] != RETRY_NOTE
    kinds = {kind.rsplit("-", 1)[0] for d in demonstrations for kind in turn_kinds(d) if kind}
    assert kinds == {"call", "answer", "retry-input", "retry-k", "retry-corrupted"}


def test_a_model_that_notices_says_the_note_after_noise_calls_only_and_one_that_never_does_is_told_apart(
        demonstrations, tokenizer, tokenizer_path, standin_tokenizer_path):
    chat_format = ChatFormat(tokenizer)
    note_token, call_token = chat_format.encode(RETRY_NOTE)[0], chat_format.encode("<tool_call>")[0]
    noisy = [d for d in demonstrations if None in turn_kinds(d)]
    retry_starts, blind_at = set(), {}
    for demonstration in noisy:
        episode = demonstration_episode(demonstration, chat_format)
        starts = [turn.start for kind, turn in zip(turn_kinds(demonstration), episode.turns, strict=True)
                  if kind and kind.startswith("retry")]
        retry_starts |= {episode.ids[start] for start in starts}
        blind_at[tuple(episode.ids)] = [start - 1 for start in starts]
    assert retry_starts == {note_token}  # the note's first token in context is its first token alone
    vocab = len(tokenizer)
    noticing = probe(Oracle(vocab, call_token), chat_format, demonstrations, 4096)
    blind = probe(Oracle(vocab, call_token, blind_at), chat_format, demonstrations, 4096)
    assert noticing["demonstrations"] == blind["demonstrations"] == len(noisy)
    turns = sum(kind is not None for d in noisy for kind in turn_kinds(d))
    assert sum(row["turns"] for row in noticing["kinds"].values()) == turns
    for kind, row in noticing["kinds"].items():
        retry = kind.startswith("retry")
        assert row["first_token_right"] == row["whole_turn_right"] == 1.0
        if retry:
            assert row["starts_like_note"] == 1.0
        # the note after a noise call; elsewhere only as far as a turn itself starts with the note's first token
        assert row["note_probability"] == pytest.approx(row["starts_like_note"], abs=1e-6)
        if retry:
            assert row["input_right"] == 1.0
        blind_row = blind["kinds"][kind]
        assert blind_row["first_token_right"] == blind_row["whole_turn_right"] == (0.0 if retry else 1.0)
        assert blind_row["note_probability"] == pytest.approx(0.0 if retry else row["starts_like_note"], abs=1e-6)
    if tokenizer_path != standin_tokenizer_path:  # MiniMind's tokenizer: "That" starts nothing but the note
        assert all(noticing["kinds"][kind]["starts_like_note"] == 0.0 for kind in ("call", "answer"))


def test_a_real_model_gives_shares_and_probabilities(demonstrations, tokenizer):
    report = probe(tiny_model().eval(), ChatFormat(tokenizer), demonstrations[:3], 4096)
    assert report["demonstrations"] >= 1
    for row in report["kinds"].values():
        assert row["turns"] >= 1
        assert all(0.0 <= row[key] <= 1.0 for key in ("first_token_right", "whole_turn_right", "note_probability"))
