"""A MiniMind-3-shaped stand-in tokenizer for machines without the real one: the same special-token ids (pad 0,
``<|im_start|>`` 1, eos ``<|im_end|>`` 2, ``<tool_call>``..``</think>`` 21..26), vocabulary size and chat format;
ordinary-text ids differ."""

from __future__ import annotations

import json
from pathlib import Path

from common.minimind.tokenizer import MINIMIND_ADDED_TOKENS, MINIMIND_VOCAB_SIZE, byte_level_symbols

# MiniMind-3's rendering rules, written independently (generation prompt: an empty think block unless open_thinking).
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
