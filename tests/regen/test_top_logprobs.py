"""regen's ``top_logprobs=k``: each generated token's top-k log-probabilities, asked of vLLM's chat API as token ids,
checked against the reply's ids and stored in its row beside the speculators keys."""

from __future__ import annotations

import copy
import math

import pytest

from common.config_schema import ConfigError
from regen.conversations.replies import ReplyError, parse_reply
from standins.vllm_server import SyntheticResponder, top_logprobs_content, vllm_body
from tests.helpers.regen_support import regen_config

REPLY = vllm_body("Four.", [1, 2, 3], [40, 41, 2])
REPLY["choices"][0]["logprobs"] = {"content": top_logprobs_content([40, 41, 2], 3)}


def test_the_replys_top_logprobs_become_the_rows_arrays():
    checked = parse_reply(REPLY, 16, top_logprobs=3)
    half = math.log(0.5)
    assert checked.top_logprobs["ids"] == [[40, 41, 42], [41, 42, 43], [2, 3, 4]]
    assert checked.top_logprobs["token_logprobs"] == [half] * 3
    assert checked.top_logprobs["logprobs"][0] == pytest.approx([half, 2 * half, 3 * half])
    assert parse_reply(REPLY, 16).top_logprobs is None  # not asked: not kept


def _broken(change) -> dict:
    reply = copy.deepcopy(REPLY)
    change(reply["choices"][0]["logprobs"]["content"])
    return reply


@pytest.mark.parametrize(("change", "message"), [
    (lambda content: content.pop(), "must hold one entry per generated id (3), got 2"),
    (lambda content: content[1].update(token="Four"), "logprobs.content[1].token is 'Four', not \"token_id:N\""),
    (lambda content: content[2].update(token="token_id:7"), "logprobs.content[2] is id 7, but token_ids has 2"),
    (lambda content: content[0].update(logprob=0.5), "logprobs.content[0].logprob is 0.5, not a log-probability"),
    (lambda content: content[0].update(top_logprobs=[]), "top_logprobs must list 1 to 3 entries"),
    # log-probabilities that cannot be a distribution (issue 67): a row would train a student on them
    (lambda content: content[1]["top_logprobs"][2].update(token="token_id:41"),
     "logprobs.content[1].top_logprobs: id 41 appears twice"),
    (lambda content: [item.update(logprob=0.0) for item in content[0]["top_logprobs"]],
     "logprobs.content[0].top_logprobs: its probabilities sum to 3, more than 1"),
    (lambda content: content[2]["top_logprobs"][1].update(logprob=-1e39),
     "logprobs.content[2].top_logprobs: log-probability -1e+39 is not a finite float32 at most 0"),
    (lambda content: content[0].update(logprob=-3.0),
     "logprobs.content[0].top_logprobs: the sampled id 40 has log-probability -3.0, but -0.69"),
])
def test_top_logprobs_that_do_not_match_the_ids_are_a_reply_error(change, message):
    with pytest.raises(ReplyError) as refused:
        parse_reply(_broken(change), 16, top_logprobs=3)
    assert message in str(refused.value)


def test_a_run_asks_for_token_id_logprobs_and_stores_them_in_each_row(serve, regen, tokenizer_path):
    server = serve(SyntheticResponder(str(tokenizer_path / "tokenizer.json"), completion_words=5))
    rows = [{"id": "a", "messages": [{"role": "user", "content": "Hi?"}]}]
    summary, out, errors = regen([server.url], rows, "top_logprobs=4", "concurrency=1")
    assert not errors and len(out) == 1
    request = server.requests[0]
    assert (request["logprobs"], request["top_logprobs"], request["return_tokens_as_token_ids"]) == (True, 4, True)
    row = out[0]
    generated = [i for i, flag in zip(row["input_ids"], row["loss_mask"], strict=True) if flag]
    assert [ids[0] for ids in row["top_logprobs"]["ids"]] == generated  # the stand-in ranks the id itself first
    assert all(len(ids) == 4 for ids in row["top_logprobs"]["ids"])
    assert list(row) == ["id", "primary_id", "input_ids", "loss_mask", "text", "top_logprobs", "metadata"]


def test_extra_request_params_may_not_ask_for_logprobs_itself(tmp_path, tokenizer_path):
    from regen.settings import RegenSettings

    cfg = regen_config(tmp_path, ["http://127.0.0.1:9"], tmp_path / "rows.jsonl", tokenizer_path,
                       "+extra_request_params={top_logprobs: 5}")
    with pytest.raises(ConfigError, match=r"extra_request_params may not set \['top_logprobs'\]"):
        RegenSettings.from_config(cfg)
