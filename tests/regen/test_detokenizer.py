"""Row text: the byte-table decode equals the library's, other tokenizers fall back, wrong ids stop the run."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from regen.conversations.detokenizer import (
    Detokenizer,
    TokenizerMismatchError,
    TokenizerNotFoundError,
    load_detokenizer,
)

TEXTS = ["héllo wörld, ça va? 你好，世界", "def f(x):\n    return x ** 2  # 🙂", "plain ascii text " * 4]


def test_byte_table_matches_transformers_decode(tokenizer_path, tokenizer):
    text = Detokenizer(tokenizer_path / "tokenizer.json", "minimind")
    assert text.uses_byte_table
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": TEXTS[0]}, {"role": "assistant", "content": TEXTS[1]}], tokenize=True,
        return_dict=False)
    rng = random.Random(1)
    samples = [list(chat)] + [[rng.randrange(text.vocab_size) for _ in range(300)] for _ in range(50)]
    for ids in samples:
        assert text.decode(ids) == tokenizer.decode(ids, skip_special_tokens=False)
    assert text.decode(list(chat)).count("<|im_start|>") == 2


def _trained(model, trainer, pre_tokenizer, decoder, path):
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoder
    tokenizer.train_from_iterator(TEXTS * 20, trainer)
    tokenizer.add_special_tokens(["<|end|>"])
    tokenizer.save(str(path))
    return path


def test_byte_level_tokenizer_uses_the_table_and_others_fall_back(tmp_path):
    byte_level = _trained(models.BPE(), trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
                          pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel(), tmp_path / "bl.json")
    word_piece = _trained(models.WordPiece(unk_token="[UNK]"), trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]"]),
                          pre_tokenizers.Whitespace(), decoders.WordPiece(), tmp_path / "wp.json")
    for path, table in ((byte_level, True), (word_piece, False)):
        text = Detokenizer(path, path.name)
        assert text.uses_byte_table is table
        library = Tokenizer.from_file(str(path))
        for sample in TEXTS:
            ids = library.encode(sample).ids + [library.token_to_id("<|end|>")]
            assert text.decode(ids) == library.decode(ids, skip_special_tokens=False)
        with pytest.raises(TokenizerMismatchError, match=f"token id {text.vocab_size + 5} is outside the vocabulary"):
            text.decode([1, text.vocab_size + 5])


def test_tokenizer_is_found_by_folder_file_or_hub_id(tmp_path, tokenizer_path, monkeypatch):
    assert load_detokenizer([None, str(tokenizer_path)]).source == str(tokenizer_path)
    assert load_detokenizer([str(tokenizer_path / "tokenizer.json")]).vocab_size == 6400
    downloads = []

    def fake_download(repo_id, filename):
        downloads.append((repo_id, filename))
        return str(tokenizer_path / "tokenizer.json")

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    assert load_detokenizer([str(tmp_path / "weights.pth"), "org/model"]).source == "org/model"
    assert downloads == [("org/model", "tokenizer.json")]
    with pytest.raises(TokenizerNotFoundError, match=r"tried not a dir: FileNotFoundError: not a dir is neither") as refused:
        load_detokenizer(["not a dir"])
    assert refused.value.hint == "set tokenizer= to the served model's tokenizer folder or hub id"
