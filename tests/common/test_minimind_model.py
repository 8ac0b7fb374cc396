"""Native MiniMind checkpoints <-> transformers Qwen3 / Qwen3-MoE: strict loading, round trips, clear errors."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
import torch.nn.functional as F

from common.minimind.model import (
    CheckpointMismatchError,
    MiniMindArch,
    ModelSpec,
    build_model,
    cache_keyword,
    load_model,
    load_native,
    read_native_state_dict,
    save_native,
)
from common.minimind.standin_tokenizer import build_standin_tokenizer
from common.minimind.tokenizer import check_same_tokenizer, load_tokenizer
from common.user_errors import UserError, error_lines

DENSE = MiniMindArch(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
MOE = dataclasses.replace(DENSE, use_moe=True)


def fp16_exact_model(arch: MiniMindArch, seed: int = 0):
    """A random model whose fp32 weights are exactly representable in fp16 (so a native save is lossless)."""
    torch.manual_seed(seed)
    model = build_model(arch).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.half().float())
    return model


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_minimind_formulas():
    config = MiniMindArch(hidden_size=768, num_hidden_layers=8).hf_config()
    assert (config.head_dim, config.intermediate_size, config.vocab_size) == (96, 2432, 6400)
    assert (config.num_attention_heads, config.num_key_value_heads) == (8, 4)
    assert (config.rope_theta if hasattr(config, "rope_theta") else config.rope_parameters["rope_theta"]) == 1e6
    assert config.rms_norm_eps == 1e-6 and config.tie_word_embeddings
    moe = MiniMindArch(hidden_size=768, num_hidden_layers=8, use_moe=True).hf_config()
    assert (moe.num_experts, moe.num_experts_per_tok, moe.norm_topk_prob, moe.moe_intermediate_size) == (4, 1, True, 2432)


@pytest.mark.parametrize("arch", [DENSE, MOE], ids=["dense", "moe"])
def test_native_round_trip_keeps_logits_and_minimind_names(tmp_path, arch):
    model = fp16_exact_model(arch)
    ids = torch.randint(0, arch.vocab_size, (2, 11), generator=torch.Generator().manual_seed(1))
    path = save_native(model, tmp_path / "m.pth")
    state = read_native_state_dict(path)
    assert all(t.dtype == torch.float16 for t in state.values())
    assert state["model.layers.1.self_attn.q_norm.weight"].shape == (16,)
    assert state["lm_head.weight"].shape == state["model.embed_tokens.weight"].shape == (6400, 64)
    assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])
    if arch.use_moe:
        assert state["model.layers.0.mlp.experts.3.gate_proj.weight"].shape == (256, 64)
        assert state["model.layers.0.mlp.experts.3.down_proj.weight"].shape == (64, 256)
        assert state["model.layers.0.mlp.gate.weight"].shape == (4, 64)
        assert not any("gate_up_proj" in k for k in state)
    else:
        assert state["model.layers.0.mlp.up_proj.weight"].shape == (256, 64)
    loaded = load_native(path, arch).eval()
    assert torch.equal(logits(model, ids), logits(loaded, ids))
    # saving the loaded model again reproduces the file exactly
    again = read_native_state_dict(save_native(loaded, tmp_path / "again.pth"))
    assert state.keys() == again.keys() and all(torch.equal(state[k], again[k]) for k in state)


def test_moe_experts_follow_minimind_semantics(tmp_path):
    """A hand-computed MiniMind MoE MLP (softmax router, top-1, silu(gate)*up -> down) equals the HF block."""
    model = fp16_exact_model(MOE, seed=3)
    state = read_native_state_dict(save_native(model, tmp_path / "moe.pth"))
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    prefix = "model.layers.0.mlp."
    scores = F.softmax(x @ state[prefix + "gate.weight"].float().T, dim=-1)
    expert = scores.argmax(dim=-1)  # top-1 with normalized top-k: the chosen expert's weight is exactly 1
    expected = torch.stack([
        (F.silu(x[i] @ state[f"{prefix}experts.{e}.gate_proj.weight"].float().T)
         * (x[i] @ state[f"{prefix}experts.{e}.up_proj.weight"].float().T))
        @ state[f"{prefix}experts.{e}.down_proj.weight"].float().T
        for i, e in enumerate(expert.tolist())
    ])
    with torch.no_grad():
        actual = model.model.layers[0].mlp(x[None])[0]
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="teacher checkpoint not found: .*nope.pth"):
        load_native(tmp_path / "nope.pth", DENSE, role="teacher")


@pytest.mark.parametrize("content, reason", [
    (b"not a torch file", "Unsupported operand 110"),  # torch's safe loader: its reason, not its weights_only advice
    (b"", "EOFError: the file is empty or cut short"),
    (b"PK\x03\x04garbage", "PytorchStreamReader failed reading zip archive: not a ZIP archive"),
])
def test_corrupt_checkpoint_is_reported_in_one_line_with_torchs_reason(tmp_path, content, reason):
    bad = tmp_path / "bad.pth"
    bad.write_bytes(content)
    with pytest.raises(ValueError) as refused:
        load_native(bad, DENSE)
    assert str(refused.value) == f"model checkpoint {bad} is not a readable torch state dict ({reason})"


def test_a_checkpoint_transformers_cannot_load_is_a_user_error_naming_the_key(tmp_path):
    """A file that is no .pth (the data file, say), and a folder whose config.json names no model type."""
    data = tmp_path / "agent.jsonl"
    data.write_text('{"messages": []}\n')
    with pytest.raises(UserError, match=f"teacher.checkpoint {data} is not a checkpoint: a MiniMind checkpoint is"):
        load_model(ModelSpec(checkpoint=str(data), tokenizer=None), role="teacher")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "config.json").write_text("{}")
    with pytest.raises(UserError, match="models.a.checkpoint .*folder: transformers cannot load it as a model: "):
        load_model(ModelSpec(checkpoint=str(tmp_path / "folder"), tokenizer=None), role="models.a")


@pytest.mark.parametrize(
    "saved,configured,hint",
    [
        (DENSE, MOE, "use_moe=False"),
        (MOE, DENSE, "use_moe=True"),
        (DENSE, dataclasses.replace(DENSE, hidden_size=128), "hidden_size=64"),
        (DENSE, dataclasses.replace(DENSE, num_hidden_layers=3), "num_hidden_layers=2"),
        (DENSE, dataclasses.replace(DENSE, num_key_value_heads=4), "num_key_value_heads=2"),
    ],
    ids=["dense-as-moe", "moe-as-dense", "hidden", "layers", "kv-heads"],
)
def test_wrong_architecture_flags_are_named(tmp_path, saved, configured, hint):
    path = save_native(build_model(saved), tmp_path / "m.pth")
    with pytest.raises(CheckpointMismatchError) as error:
        load_native(path, configured, role="student")
    what, fix = error_lines(error.value)  # what differs, and the flags the file implies
    assert "m.pth (student)" in what and ("missing" in what or "shape mismatch" in what or "unexpected" in what)
    assert hint in fix and fix.endswith(": fix those flags in the model config")


def test_missing_key_is_listed(tmp_path):
    state = {k: v for k, v in build_model(DENSE).state_dict().items() if "layers.1.self_attn.k_norm" not in k}
    path = tmp_path / "cut.pth"
    torch.save(state, path)
    with pytest.raises(CheckpointMismatchError, match=r"1 missing key\(s\), e.g. \['model.layers.1.self_attn.k_norm.weight'\]"):
        load_native(path, DENSE)


def write_native(tmp_path, arch, name="m.pth"):
    return str(save_native(fp16_exact_model(arch), tmp_path / name))


def test_load_model_from_config_block(tmp_path, tokenizer_path):
    block = {"checkpoint": write_native(tmp_path, DENSE), "tokenizer": str(tokenizer_path),
             **dataclasses.asdict(DENSE)}
    model, tokenizer = load_model(ModelSpec(**block), role="student")
    assert len(tokenizer) == 6400 and model.config.hidden_size == 64


def test_load_model_requires_a_tokenizer_for_native_files(tmp_path):
    block = {"checkpoint": write_native(tmp_path, DENSE), "tokenizer": None, **dataclasses.asdict(DENSE)}
    with pytest.raises(ValueError, match="student.tokenizer is not set"):
        load_model(ModelSpec(**block), role="student")


def test_tokenizer_vocab_must_match_model(tmp_path, tokenizer_path):
    wide = dataclasses.replace(DENSE, vocab_size=7000)
    block = {"checkpoint": write_native(tmp_path, wide), "tokenizer": str(tokenizer_path), **dataclasses.asdict(wide)}
    with pytest.raises(ValueError, match="tokenizer has 6400 tokens but the model's vocabulary is 7000"):
        load_model(ModelSpec(**block), role="teacher")


def test_hf_model_folder_loads_with_its_tokenizer(tmp_path, tokenizer_path):
    model = fp16_exact_model(DENSE)
    model.save_pretrained(tmp_path / "hf")
    load_tokenizer(str(tokenizer_path)).save_pretrained(tmp_path / "hf")
    loaded, tokenizer = load_model(ModelSpec(checkpoint=str(tmp_path / "hf")), role="teacher")
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(logits(model, ids), logits(loaded.eval(), ids)) and len(tokenizer) == 6400
    with pytest.raises(FileNotFoundError, match="teacher model folder not found"):
        load_model(ModelSpec(checkpoint=str(tmp_path / "missing")), role="teacher")


def test_teacher_and_student_tokenizers_must_agree(tmp_path, standin_tokenizer_path):
    first = load_tokenizer(str(standin_tokenizer_path))
    check_same_tokenizer(first, load_tokenizer(str(standin_tokenizer_path)))
    other = load_tokenizer(str(build_standin_tokenizer(tmp_path / "other")))
    other.add_tokens(["<extra_token>"])
    with pytest.raises(ValueError, match="teacher and student tokenizers differ"):
        check_same_tokenizer(first, other)


def test_cache_keyword_follows_the_base_model_through_pass_through_subclasses():
    model = build_model(DENSE)
    keyword = cache_keyword(model)
    assert keyword in ("cache", "past_key_values")
    assert keyword in inspect.signature(type(model).forward).parameters

    class PassThrough(type(model)):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    assert cache_keyword(PassThrough(model.config)) == keyword
    with pytest.raises(TypeError, match="takes neither `cache` nor `past_key_values`"):
        cache_keyword(torch.nn.Linear(2, 2))
