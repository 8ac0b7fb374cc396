"""What every request carries: sampling without nulls, extra parameters, per-conversation mixes."""

from __future__ import annotations

from collections import Counter

from regen.conversations.request_params import RequestParams
from regen.settings import WeightedChoice
from tests.helpers.regen_support import EOS, ok

SAMPLING = {"temperature": 0.7, "top_p": None, "top_k": 20, "seed": None}
EFFORT = WeightedChoice(("low", "high"), (1.0, 3.0))
TEMPERATURE = WeightedChoice((0.6, 1.0), (1.0, 0.0))


def test_null_sampling_keys_are_omitted_and_extras_merged():
    params = RequestParams(SAMPLING, {"chat_template_kwargs": {"enable_thinking": False}})
    assert params.for_conversation("a") == {"temperature": 0.7, "top_k": 20,
                                            "chat_template_kwargs": {"enable_thinking": False}}


def test_mixes_are_drawn_per_conversation_and_reproducible():
    params = RequestParams(SAMPLING, reasoning_effort=EFFORT, temperature=TEMPERATURE, mix_seed=7)
    draws = [params.for_conversation(f"conv-{i}") for i in range(400)]
    assert all(d["temperature"] == 0.6 and d["top_k"] == 20 for d in draws)  # weight 0 is never drawn
    efforts = Counter(d["reasoning_effort"] for d in draws)
    assert set(efforts) == {"low", "high"} and 60 < efforts["low"] < 140  # about 1 in 4
    again = RequestParams(SAMPLING, reasoning_effort=EFFORT, temperature=TEMPERATURE, mix_seed=7)
    assert [again.for_conversation(f"conv-{i}") for i in reversed(range(400))] == draws[::-1]
    other_seed = RequestParams(SAMPLING, reasoning_effort=EFFORT, mix_seed=8)
    assert [other_seed.for_conversation(f"conv-{i}")["reasoning_effort"] for i in range(400)] != [
        d["reasoning_effort"] for d in draws]


def test_logit_bias_from_the_command_line_reaches_the_server_with_string_keys(serve, regen, tmp_path):
    server = serve(lambda payload: ok("x", [1, 5], [6, EOS]))
    summary, out, errors = regen([server.url], [{"id": "a", "prompt": "a"}],
                                 "extra_request_params={logit_bias: {21: 100}}")
    assert [request["logit_bias"] for request in server.requests] == [{"21": 100}]
    assert out[0]["metadata"]["sampling_params"]["logit_bias"] == {"21": 100} and errors == []
