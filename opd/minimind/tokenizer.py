"""Tokenizer loading and checks, plus a MiniMind-3-shaped stand-in for machines without the real one.

The real MiniMind-3 tokenizer is never shipped with this repo: users point ``tokenizer=`` at their
MiniMind checkout's tokenizer folder or a hub id. The stand-in keeps every special-token id of the
real one (``<|endoftext|>``=0 pad, ``<|im_start|>``=1, ``<|im_end|>``=2 eos, ``<tool_call>``..``</think>``
= 21..26), has the same vocabulary size (6400) and a chat template that renders the same format, so
tests and the demo run without it. Its ordinary-text ids differ from the real tokenizer's.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.user_errors import UserError

# Special and added tokens of MiniMind-3, in id order (ids 0..35). ``special`` follows the real
# tokenizer: the tool/think markers are added tokens that survive ``skip_special_tokens``.
MINIMIND_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<|audio_start|>", True),
    ("<|audio_end|>", True), ("<|audio_pad|>", True), ("<tts_pad>", True), ("<tts_text_bos>", True),
    ("<tts_text_eod>", True), ("<tts_text_bos_single>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<tool_response>", False),
    ("</tool_response>", False), ("<think>", False), ("</think>", False),
) + tuple((f"<|buffer{i}|>", False) for i in range(1, 10))
MINIMIND_VOCAB_SIZE = 6400

# Same rendering rules as MiniMind-3's template (tools listed in the system turn, assistant turns as
# "<think>\n...\n</think>\n\n..." with <tool_call> blocks, consecutive tool messages merged into one
# user turn of <tool_response> blocks, generation prompt with an empty think block unless
# open_thinking), written independently.
STANDIN_CHAT_TEMPLATE = (
    "{%- set first_is_system = messages and messages[0].role == 'system' -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if first_is_system -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nFunctions you may call are listed inside <tools></tools>:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nCall a function by writing a JSON object with its name and arguments inside "
    "<tool_call></tool_call> tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' -}}"
    "{%- elif first_is_system -%}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set text = message.content if message.content is string else '' -%}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + text + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{%- set thought = '' -%}"
    "{%- if message.reasoning_content is string -%}{%- set thought = message.reasoning_content -%}"
    "{%- elif '</think>' in text -%}"
    "{%- set thought = text.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}"
    "{%- set text = text.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + thought.strip('\\n') + '\\n</think>\\n\\n' + text.lstrip('\\n') -}}"
    "{%- for call in (message.tool_calls or []) -%}"
    "{%- set fn = call.function if call.function else call -%}"
    "{%- if text or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' -}}"
    "{{- fn.arguments if fn.arguments is string else (fn.arguments | tojson) -}}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + text + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if open_thinking is defined and open_thinking -%}{{- '<think>\\n' -}}"
    "{%- else -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)


def looks_like_local_path(text: str) -> bool:
    """A path rather than a hub id ("org/name" or "name"): absolute, relative-dotted, ~, or several parts."""
    return text.startswith((".", "/", "~")) or text.count("/") > 1 or Path(text).exists()


def load_tokenizer(name_or_path: str, *, role: str = "tokenizer"):
    """Load a tokenizer from a local folder or a hub id; it must define EOS and PAD and a chat template."""
    from transformers import AutoTokenizer

    if not name_or_path:
        raise UserError(
            f"{role} is not set: point it at a MiniMind tokenizer folder (the checkout's model/ folder) "
            "or a hub id, or set MINIMIND_TOKENIZER"
        )
    text = str(name_or_path)
    local = Path(text).expanduser()
    if looks_like_local_path(text) and not local.exists():
        raise FileNotFoundError(f"{role}: tokenizer folder not found: {text}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(local) if local.exists() else text)
    except (OSError, ValueError) as error:  # a file, a folder without tokenizer files, a hub id not cached
        raise UserError(f"{role} {text}: transformers cannot load it as a tokenizer: "
                        f"{str(error).strip().splitlines()[0]}") from None
    missing = [name for name in ("eos_token_id", "pad_token_id") if getattr(tokenizer, name) is None]
    if missing:
        raise UserError(f"{role} {text}: tokenizer defines no {', '.join(missing)}")
    if not tokenizer.chat_template:
        raise UserError(f"{role} {text}: tokenizer has no chat_template")
    return tokenizer


def check_same_tokenizer(first, second, first_name: str = "teacher", second_name: str = "student") -> None:
    """Refuse two tokenizers that would map the same ids to different tokens."""
    if first is second:
        return
    a, b = first.get_vocab(), second.get_vocab()
    if a != b:
        only_a = sorted(set(a.items()) - set(b.items()), key=lambda kv: kv[1])[:5]
        only_b = sorted(set(b.items()) - set(a.items()), key=lambda kv: kv[1])[:5]
        raise UserError(
            f"{first_name} and {second_name} tokenizers differ (sizes {len(a)} vs {len(b)}); "
            f"first differing entries: {first_name} {only_a}, {second_name} {only_b}. "
            "Distillation needs one shared vocabulary."
        )
    for attribute in ("eos_token_id", "pad_token_id"):
        if getattr(first, attribute) != getattr(second, attribute):
            raise UserError(
                f"{first_name} and {second_name} tokenizers differ in {attribute}: "
                f"{getattr(first, attribute)} vs {getattr(second, attribute)}"
            )


def byte_level_symbols() -> list[str]:
    """The printable character byte-level BPE (GPT-2, Qwen, MiniMind) uses for each byte 0..255, in byte order."""
    kept = {*range(33, 127), *range(161, 173), *range(174, 256)}
    symbols, shifted = [], 0
    for byte in range(256):
        if byte in kept:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return symbols


def build_standin_tokenizer(out_dir: str | Path) -> Path:
    """Write a MiniMind-3-shaped byte-level BPE tokenizer (same special ids, vocab 6400) to ``out_dir``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for content, _special in MINIMIND_ADDED_TOKENS:
        vocab[content] = len(vocab)
    symbols = byte_level_symbols()
    for symbol in symbols:
        vocab[symbol] = len(vocab)
    # Fill the remaining ids with deterministic two-symbol merges over printable ASCII, so every id
    # decodes to real text (a random model samples all of them).
    ascii_symbols = [symbols[b] for b in range(32, 127)]
    merges: list[tuple[str, str]] = []
    for left in ascii_symbols:
        for right in ascii_symbols:
            if len(vocab) == MINIMIND_VOCAB_SIZE:
                break
            vocab[left + right] = len(vocab)
            merges.append((left, right))
    core = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    core.add_tokens([AddedToken(c, special=s, normalized=False) for c, s in MINIMIND_ADDED_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=[c for c, s in MINIMIND_ADDED_TOKENS if s and c not in
                                   ("<|endoftext|>", "<|im_start|>", "<|im_end|>")],
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    tokenizer.chat_template = STANDIN_CHAT_TEMPLATE
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    (out / "STANDIN.json").write_text(json.dumps({"note": "MiniMind-3-shaped stand-in; not the real tokenizer"}))
    return out
