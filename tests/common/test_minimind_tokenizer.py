"""The tokenizer the suite uses (real MiniMind-3 or the stand-in) renders MiniMind-3's chat format exactly."""

from __future__ import annotations

import pytest

from common.minimind.tokenizer import MINIMIND_ADDED_TOKENS, load_tokenizer
from common.user_errors import UserError

WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "w",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}

# Literal renderings of MiniMind-3's template (checked against the real tokenizer). With tools, only the
# part after the tool preamble is compared: the stand-in words its preamble differently.
CASES = [
    (
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
         {"role": "assistant", "content": "yo"}, {"role": "user", "content": "more"}],
        None,
        "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nyo<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n",
    ),
    (
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nyo"},
         {"role": "user", "content": "x"}],
        None,
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nyo<|im_end|>\n"
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    ),
    (
        [{"role": "user", "content": "w?"},
         {"role": "assistant", "content": "let me", "tool_calls": [
             {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
             {"name": "get_weather", "arguments": {"city": "Rome"}}]},
         {"role": "tool", "content": "{\"t\": 4}", "tool_call_id": "a"}, {"role": "tool", "content": "second"}],
        [WEATHER_TOOL],
        "<|im_start|>user\nw?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nlet me\n"
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n{\"t\": 4}\n</tool_response>\n<tool_response>\nsecond\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    ),
]


@pytest.fixture(params=["suite", "standin"])
def any_tokenizer(request, tokenizer_path, standin_tokenizer_path):
    return load_tokenizer(str(tokenizer_path if request.param == "suite" else standin_tokenizer_path))


@pytest.mark.parametrize("messages,tools,expected", CASES)
def test_chat_template_renders_minimind_format(any_tokenizer, messages, tools, expected):
    text = any_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    if tools:
        preamble, _, text = text.partition("</tool_call><|im_end|>\n")
        assert preamble.startswith("<|im_start|>system\n") and '"name": "get_weather"' in preamble
    assert text == expected


def test_open_thinking_prompt(any_tokenizer):
    text = any_tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False,
                                             add_generation_prompt=True, open_thinking=True)
    assert text.endswith("<|im_start|>assistant\n<think>\n")


def test_special_ids_and_round_trip(any_tokenizer):
    assert len(any_tokenizer) == 6400
    assert (any_tokenizer.pad_token_id, any_tokenizer.eos_token_id) == (0, 2)
    for expected_id, (content, _special) in enumerate(MINIMIND_ADDED_TOKENS):
        assert any_tokenizer.convert_tokens_to_ids(content) == expected_id
    text = "Weather in Zürich? 你好 <tool_call>\n{\"name\": \"x\"}\n</tool_call><|im_end|>"
    ids = any_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert 21 in ids and 22 in ids and ids[-1] == 2
    assert any_tokenizer.decode(ids) == text


def test_missing_tokenizer_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="student.tokenizer: tokenizer folder not found"):
        load_tokenizer(str(tmp_path / "none"), role="student.tokenizer")
    with pytest.raises(ValueError, match="teacher.tokenizer is not set"):
        load_tokenizer(None, role="teacher.tokenizer")


def test_a_tokenizer_transformers_cannot_load_is_a_user_error_naming_the_key(tmp_path):
    data = tmp_path / "agent.jsonl"
    data.write_text('{"messages": []}\n')
    with pytest.raises(UserError, match=f"student.tokenizer {data}: transformers cannot load it as a tokenizer: "):
        load_tokenizer(str(data), role="student.tokenizer")


def test_byte_level_symbols_are_the_tokenizers_alphabet():
    from tokenizers.pre_tokenizers import ByteLevel

    from common.minimind.tokenizer import byte_level_symbols

    symbols = byte_level_symbols()
    assert len(symbols) == 256 and set(symbols) == set(ByteLevel.alphabet())
    assert symbols[ord("A")] == "A" and symbols[ord(" ")] == "Ġ" and symbols[ord("\n")] == "Ċ"
