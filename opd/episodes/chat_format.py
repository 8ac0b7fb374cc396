"""Token ids for an episode's context, rendered by the tokenizer's own chat template.

What goes between a sampled turn's EOS and the next turn is derived from the template, never hard-coded: render an
assistant turn holding a marker, then the tool messages and a generation prompt; after the marker come the EOS
(already sampled) and then the observation context.
"""

from __future__ import annotations

from common.chat_records import AgentRecord
from common.minimind.tokenizer import max_token_bytes, token_floor
from common.user_errors import UserError

_MARKER = "OPD-ASSISTANT-CONTENT-MARKER-7f3a"


class PromptTooLongError(UserError):
    """A record whose prompt leaves no room to generate within ``max_total_len``."""


def _too_long(record: AgentRecord, tokens, max_total_len: int) -> str:
    return (f"{record.source}: prompt is {tokens} tokens, leaving no room to generate within "
            f"max_total_len={max_total_len}; raise max_total_len or shorten/drop this record")


class ChatFormat:
    """Prompt and observation token ids of one tokenizer's chat template (``open_thinking`` passed through)."""

    def __init__(self, tokenizer, *, open_thinking: bool = False) -> None:
        self.tokenizer = tokenizer
        self.open_thinking = open_thinking
        self.eos_token_id = tokenizer.eos_token_id
        self.pad_token_id = tokenizer.pad_token_id
        self.max_token_bytes = max_token_bytes(tokenizer)
        self.observation_ids(None, ["{}"])  # fail at construction if the template cannot be split

    def render(self, messages: list[dict], tools: list[dict] | None, *, generation_prompt: bool = True) -> str:
        """The template's text for ``messages`` (with the assistant generation prompt unless told otherwise)."""
        return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                  add_generation_prompt=generation_prompt,
                                                  open_thinking=self.open_thinking)

    def encode(self, text: str) -> list[int]:
        """Token ids of template text (special-token strings become their ids; no BOS/EOS added)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def token_floor(self, text: str) -> int:
        """Fewer tokens than this ``text`` cannot encode to (``common.minimind.tokenizer.token_floor``)."""
        return token_floor(len(text.encode()), self.max_token_bytes)

    def prompt_ids(self, record: AgentRecord, max_total_len: int | None = None) -> list[int]:
        """The templated prompt with its generation prompt; raises when it leaves no room to generate (a prompt
        far too long for that is refused before it is tokenized)."""
        text = self.render(record.messages, record.tools)
        if max_total_len is not None and (floor := self.token_floor(text)) >= max_total_len:
            raise PromptTooLongError(_too_long(record, f"at least {floor}", max_total_len))
        ids = self.encode(text)
        if max_total_len is not None and len(ids) >= max_total_len:
            raise PromptTooLongError(_too_long(record, len(ids), max_total_len))
        return ids

    def observation_ids(self, record: AgentRecord | None, contents: list[str]) -> list[int]:
        """Context after a turn's EOS: the tool messages (one per content, in order) and the next generation prompt."""
        messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _MARKER}]
        messages += [{"role": "tool", "content": content} for content in contents]
        text = self.render(messages, record.tools if record else None)
        _, found, after = text.partition(_MARKER)
        eos = self.tokenizer.eos_token
        if not found or not after.startswith(eos):
            raise ValueError(
                f"the chat template does not end an assistant turn with the EOS token {eos!r} right after its "
                f"content (rendered: {after[:60]!r}); observation tokens cannot be derived from it")
        return self.encode(after[len(eos):])

    def decode(self, ids: list[int]) -> str:
        """Text of generated ids for tool-call parsing (special tokens dropped, tool markup kept)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)
