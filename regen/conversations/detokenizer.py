"""Decoding ``input_ids`` into each row's review ``text`` with the target model's ``tokenizer.json``.

Uses ``tokenizers`` directly (no torch). Special tokens are kept and no space clean-up is applied. Byte-level BPE
tokenizers decode by a byte-table lookup, checked at load against ``Tokenizer.decode``, which is used otherwise.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders

from common.minimind.tokenizer import byte_level_symbols
from common.user_errors import UserError

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


class TokenizerMismatchError(UserError):
    """The replies carry ids the configured tokenizer does not have: the whole run is misconfigured."""


class TokenizerNotFoundError(UserError):
    """No candidate names a readable ``tokenizer.json``."""


def _byte_table_decoder(tokenizer: Tokenizer, vocab_size: int) -> Callable[[list[int]], str] | None:
    """A table-lookup decoder equal to ``tokenizer.decode(ids, skip_special_tokens=False)``, or ``None``."""
    if not isinstance(tokenizer.decoder, decoders.ByteLevel):
        return None
    byte_of = {symbol: byte for byte, symbol in enumerate(byte_level_symbols())}
    added = {index: token.content.encode("utf-8") for index, token in tokenizer.get_added_tokens_decoder().items()}
    table: list[bytes] = []
    for index in range(vocab_size):
        if index in added:
            table.append(added[index])
            continue
        token = tokenizer.id_to_token(index)
        if token is None or any(char not in byte_of for char in token):
            return None
        table.append(bytes(byte_of[char] for char in token))
    lookup = table.__getitem__

    def decode(ids: list[int]) -> str:
        return b"".join(map(lookup, ids)).decode("utf-8", "replace")

    rng = random.Random(0)
    samples = [list(range(start, min(start + 512, vocab_size))) for start in range(0, vocab_size, 512)]
    samples += [[rng.randrange(vocab_size) for _ in range(rng.randrange(1, 400))] for _ in range(200)]
    if all(decode(ids) == tokenizer.decode(ids, skip_special_tokens=False) for ids in samples):
        return decode
    return None


class Detokenizer:
    """``decode(ids)`` with special tokens kept; ids outside the vocabulary are an error."""

    def __init__(self, tokenizer_file: Path, source: str):
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.fingerprint = "sha256:" + hashlib.sha256(Path(tokenizer_file).read_bytes()).hexdigest()
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.source = source
        self._fast = _byte_table_decoder(self.tokenizer, self.vocab_size)
        think = (self.tokenizer.token_to_id(THINK_OPEN), self.tokenizer.token_to_id(THINK_CLOSE))
        self.think_ids: tuple[int, int] | None = None if None in think else think  # (<think>, </think>)

    @property
    def uses_byte_table(self) -> bool:
        return self._fast is not None

    def decode(self, ids: list[int]) -> str:
        if self._fast is not None:
            try:
                return self._fast(ids)
            except IndexError:  # an id past the table: reported below
                pass
        top = max(ids)
        if top >= self.vocab_size:
            raise TokenizerMismatchError(
                f"token id {top} is outside the vocabulary of tokenizer {self.source} ({self.vocab_size} ids)",
                "set tokenizer= to the served model's tokenizer folder or hub id")
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def _tokenizer_file(name: str) -> Path:
    path = Path(name).expanduser()
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return path / "tokenizer.json"
    if path.is_file() and path.name == "tokenizer.json":
        return path
    if path.exists():
        raise FileNotFoundError(f"{name} has no tokenizer.json")
    if not _HUB_ID.match(name):
        raise FileNotFoundError(f"{name} is neither a local tokenizer folder nor a hub id")
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(name, "tokenizer.json"))


def load_detokenizer(candidates: Iterable[str | None], *, explicit: str | None = None) -> Detokenizer:
    """The ``explicit`` tokenizer (``tokenizer=``: it must load), else the first candidate (tokenizer folder,
    ``tokenizer.json`` or hub id) that yields a tokenizer."""
    if explicit:
        try:
            return Detokenizer(_tokenizer_file(explicit), explicit)
        except Exception as error:  # noqa: BLE001 - any failure: the setting is wrong, not a reason to guess
            raise TokenizerNotFoundError(f"tokenizer={explicit} cannot be loaded ({type(error).__name__}: {error})",
                                    "point tokenizer= at the served model's tokenizer folder (with tokenizer.json) "
                                    "or hub id, or leave it unset to use the model's own") from None
    tried, seen = [], set()
    for name in candidates:
        if not name or name in seen:
            continue
        seen.add(name)
        try:
            return Detokenizer(_tokenizer_file(str(name)), str(name))
        except Exception as error:  # noqa: BLE001 - every failure is reported together below
            tried.append(f"{name}: {type(error).__name__}: {error}")
    raise TokenizerNotFoundError(
        "no tokenizer.json for the row text" + (" (tried " + "; ".join(tried) + ")" if tried else ""),
        "set tokenizer= to the served model's tokenizer folder or hub id")
