"""The vLLM stand-in cuts an answer at the request's ``max_tokens`` as vLLM does: that many ids, ``finish_reason``
"length", the text of those ids; an answer within the limit is whole with "stop"."""

from __future__ import annotations

from standins.vllm_server import SyntheticResponder


def test_an_answer_longer_than_max_tokens_is_cut_with_finish_reason_length(tokenizer_path):
    responder = SyntheticResponder(str(tokenizer_path / "tokenizer.json"), completion_words=40)
    messages = [{"role": "user", "content": "q"}]
    whole = responder({"messages": messages}).body["choices"][0]
    assert whole["finish_reason"] == "stop" and len(whole["token_ids"]) > 10
    cut = responder({"messages": messages, "max_tokens": 10}).body["choices"][0]
    assert cut["finish_reason"] == "length"
    assert cut["token_ids"] == whole["token_ids"][:10]
    assert cut["message"]["content"] == responder.tokenizer.decode(whole["token_ids"][:10])
    assert responder({"messages": messages, "max_tokens": 10_000}).body["choices"][0] == whole
