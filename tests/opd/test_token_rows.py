"""regen's rows as opd's fixed data (``mode=offline offline.source=regen_rows``): exact targets from ``loss_mask``,
malformed rows named, and a run on rows regen wrote that trains without loading a teacher."""

from __future__ import annotations

import json

import pytest

from common.chat_records import RecordError
from common.minimind.model import load_native
from common.minimind.tiny import tiny_arch
from opd.episodes.episode import MAX_GEN_LEN, pack_episodes
from opd.episodes.token_rows import load_token_rows, row_episode
from opd.train import train
from regen.job import run as regen_run
from standins.teacher_scores import PromptLogprobs
from standins.vllm_server import SyntheticResponder
from tests.helpers.configs import entry_config
from tests.helpers.regen_support import read_jsonl, regen_config, write_jsonl


def test_targets_are_exactly_the_rows_loss_mask():
    row = {"input_ids": [1, 5, 6, 7, 8, 9, 10, 11], "loss_mask": [0, 0, 1, 1, 0, 0, 1, 1]}
    episode = row_episode(row, "rows.jsonl:1", vocab=64)
    assert [(turn.start, turn.end) for turn in episode.turns] == [(2, 4), (6, 8)]
    assert episode.prompt_length == 2 and episode.target_mask() == [bool(flag) for flag in row["loss_mask"]]
    packed = pack_episodes([episode], pad_token_id=0)
    assert packed.target_mask[0].tolist() == [bool(flag) for flag in row["loss_mask"][1:]]  # logits at t predict t+1
    assert not episode.truncated


def test_a_row_cut_at_max_tokens_has_a_broken_last_turn():
    row = {"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1], "metadata": {"finish_reason": "length"}}
    episode = row_episode(row, "rows.jsonl:1", vocab=64)
    assert episode.stop_reason == MAX_GEN_LEN and episode.broken(0)
    assert episode.without_broken_turns().target_mask() == [False] * 4


@pytest.mark.parametrize(("row", "message"), [
    ([1, 2], "rows.jsonl:1: expected a JSON object with input_ids and loss_mask, got list"),
    ({"loss_mask": [0, 1]}, "rows.jsonl:1: 'input_ids' must be a non-empty list of integers"),
    ({"input_ids": [1, 99], "loss_mask": [0, 1]}, "rows.jsonl:1: input_ids[1] is 99, not an integer in [0, 64)"),
    ({"input_ids": [1, True], "loss_mask": [0, 1]}, "rows.jsonl:1: input_ids[1] is True"),
    ({"input_ids": [1, 2], "loss_mask": [0, 2]}, "rows.jsonl:1: loss_mask[1] is 2, not an integer in [0, 2)"),
    ({"input_ids": [1, 2, 3], "loss_mask": [0, 1]}, "rows.jsonl:1: loss_mask has 2 entries for 3 input_ids"),
    ({"input_ids": [1, 2], "loss_mask": [1, 1]}, "rows.jsonl:1: loss_mask[0] is 1"),
    ({"input_ids": [1, 2], "loss_mask": [0, 0]}, "rows.jsonl:1: loss_mask holds no 1: nothing to train on"),
])
def test_a_malformed_row_is_refused_naming_file_line_and_field(tmp_path, row, message):
    path = write_jsonl(tmp_path / "rows.jsonl", [row])
    with pytest.raises(RecordError) as refused:
        load_token_rows(path, vocab=64, max_total_len=100, drop_too_long=False)
    assert str(refused.value).startswith(f"{tmp_path}/{message}")


def test_a_row_over_max_total_len_is_refused_or_left_out(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]},
                                                 {"input_ids": [1, 2], "loss_mask": [0, 1]}])
    with pytest.raises(RecordError, match=r"rows.jsonl:1: the row is 4 tokens, over rollout.max_total_len=3"):
        load_token_rows(path, vocab=64, max_total_len=3, drop_too_long=False)
    episodes, _ = load_token_rows(path, vocab=64, max_total_len=3, drop_too_long=True)
    assert [episode.record.source for episode in episodes] == [f"{path}:2"]


def test_an_offline_run_on_rows_regen_wrote_trains_without_loading_a_teacher(tmp_path, serve, tiny_pair,
                                                                              tiny_checkpoints, tokenizer_path):
    """regen against a vLLM-shaped server writes rows; opd trains on them as they are, scored by a served teacher,
    with no teacher checkpoint to load."""
    target = serve(SyntheticResponder(str(tokenizer_path / "tokenizer.json"), completion_words=12)).url
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [
        {"id": f"p{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]} for i in range(4)])
    regen_run(regen_config(tmp_path, [target], prompts, tokenizer_path, "max_tokens=64"))
    rows = read_jsonl(tmp_path / "out.jsonl")
    assert len(rows) == 4
    teacher = load_native(tiny_checkpoints["teacher"], tiny_arch("teacher"))
    teacher_url = serve(completions=PromptLogprobs(teacher)).url
    cfg = entry_config("opd", [*tiny_pair, f"data={tmp_path / 'out.jsonl'}", "mode=offline",
                               "offline.source=regen_rows", "batch_size=2", "epochs=1", "device=cpu",
                               f"out_dir={tmp_path / 'run'}", "teacher.checkpoint=/nowhere/teacher.pth",
                               f"teacher_server.endpoints=[{teacher_url}]"])
    assert train(cfg)["steps"] == 2
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    targets = sum(sum(row["loss_mask"][1:]) for row in rows)
    assert sum(line["target_tokens"] for line in lines) == targets  # every generated id of every row, nothing else


def test_stored_top_logprobs_are_the_teachers_scores_of_the_targets():
    row = {"input_ids": [1, 5, 6, 7], "loss_mask": [0, 0, 1, 1],
           "top_logprobs": {"ids": [[6, 9], [3, 4]], "logprobs": [[-0.1, -2.5], [-0.7, -0.9]],
                            "token_logprobs": [-0.1, -3.0]}}
    top = row_episode(row, "rows.jsonl:1", vocab=64, with_logprobs=True).teacher_top
    assert top.ids.tolist() == [[6, 9, -1], [3, 4, 7]]  # the sampled id 7, outside its top-2, in a slot of its own
    assert top.next_token.tolist() == pytest.approx([-0.1, -3.0])
    assert top.logprobs[1].tolist() == pytest.approx([-0.7, -0.9, -3.0])


@pytest.mark.parametrize(("stored", "message"), [
    (None, "rows.jsonl:1: no top_logprobs (write the rows with onpolicy-regen top_logprobs=K"),
    ({"ids": [[6]], "logprobs": [[-0.1]], "token_logprobs": [-0.1]},
     "top_logprobs.ids, .logprobs and .token_logprobs must hold one entry per loss_mask 1 (2)"),
    ({"ids": [[6], [7, 8]], "logprobs": [[-0.1], [-0.2]], "token_logprobs": [-0.1, -0.2]},
     "top_logprobs entry 1: ids and logprobs must be lists of the same length"),
    ({"ids": [[6], [7]], "logprobs": [[-0.1], [0.5]], "token_logprobs": [-0.1, -0.2]},
     "top_logprobs entry 1: log-probabilities must be numbers <= 0"),
    ({"ids": [[6], [70]], "logprobs": [[-0.1], [-0.2]], "token_logprobs": [-0.1, -0.2]},
     "top_logprobs entry 1: ids must be integers in [0, 64)"),
    ({"ids": [[6, 6], [7]], "logprobs": [[-0.1, -3.0], [-0.2]], "token_logprobs": [-0.1, -0.2]},
     "top_logprobs entry 0: id 6 appears twice"),
    ({"ids": [[6, 9, 10, 11], [7]], "logprobs": [[0.0, 0.0, 0.0, 0.0], [-0.2]], "token_logprobs": [0.0, -0.2]},
     "top_logprobs entry 0: its probabilities sum to 4, more than 1"),
    ({"ids": [[6], [7, 8]], "logprobs": [[-0.1], [-0.2, -1e39]], "token_logprobs": [-0.1, -0.2]},
     "top_logprobs entry 1: log-probability -1e+39 is not a finite float32 at most 0"),
    ({"ids": [[6], [7]], "logprobs": [[-0.1], [-0.2]], "token_logprobs": [-0.5, -0.2]},
     "top_logprobs entry 0: the sampled id 6 has log-probability -0.5, but -0.1 in the top-k"),
])
def test_malformed_stored_logprobs_are_refused_naming_the_row(stored, message):
    row = {"input_ids": [1, 5, 6, 7], "loss_mask": [0, 0, 1, 1], **({"top_logprobs": stored} if stored else {})}
    with pytest.raises(RecordError) as refused:
        row_episode(row, "rows.jsonl:1", vocab=64, with_logprobs=True)
    assert message in str(refused.value)


def test_rows_with_stored_logprobs_train_with_no_teacher_at_all(tmp_path, serve, tiny_pair, tokenizer_path):
    target = serve(SyntheticResponder(str(tokenizer_path / "tokenizer.json"), completion_words=12)).url
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [
        {"id": f"p{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]} for i in range(4)])
    regen_run(regen_config(tmp_path, [target], prompts, tokenizer_path, "max_tokens=64", "top_logprobs=5"))
    cfg = entry_config("opd", [*tiny_pair, f"data={tmp_path / 'out.jsonl'}", "mode=offline",
                               "offline.source=regen_rows", "offline.row_logprobs=true", "batch_size=2", "device=cpu",
                               f"out_dir={tmp_path / 'run'}", "teacher.checkpoint=/nowhere/teacher.pth"])
    assert train(cfg)["steps"] == 2
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # the stand-in's made-up top-5 holds 1/2 + 1/4 + ... + 1/32 of the mass
    assert all(line["teacher_topk_mass"] == pytest.approx(1 - 1 / 32, abs=1e-5) for line in lines)


@pytest.mark.parametrize(("overrides", "message"), [
    (["offline.row_logprobs=true"], "offline.row_logprobs must be false unless offline.source=regen_rows"),
    (["offline.source=regen_rows", "offline.row_logprobs=true"],
     "offline.row_logprobs must be false with mode=on_policy"),
    (["mode=offline", "offline.source=regen_rows", "offline.row_logprobs=true",
      "teacher_server.endpoints=[http://127.0.0.1:9]"], "teacher_server.endpoints must be null with offline.row_logpro"),
    (["mode=offline", "offline.source=regen_rows", "offline.row_logprobs=true", "loss.kl_direction=reverse_kl"],
     "loss.kl_direction must be forward_kl with mode=offline with offline.row_logprobs=true"),
])
def test_stored_logprobs_settings_that_cannot_work_are_refused(tiny_pair, overrides, message):
    from common.config_schema import ConfigError

    with pytest.raises(ConfigError) as refused:
        entry_config("opd", [*tiny_pair, "data=x.jsonl", *overrides])
    assert message in str(refused.value)
