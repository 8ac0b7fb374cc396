"""Tokenizer loading and checks, and the ids MiniMind-3's tokenizer fixes (the real tokenizer is not shipped:
``tokenizer=`` names a MiniMind checkout's folder or a hub id)."""

from __future__ import annotations

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


def max_token_bytes(tokenizer) -> int:
    """The UTF-8 length of the tokenizer's longest vocabulary entry (no token's text is longer)."""
    return max(len(token.encode()) for token in tokenizer.get_vocab())


def token_floor(text_bytes: int, longest: int) -> int:
    """The fewest tokens ``text_bytes`` UTF-8 bytes can encode to, when the longest entry is ``longest`` bytes."""
    return -(-text_bytes // longest)
