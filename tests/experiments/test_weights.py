"""A run folder keeps weights as safetensors (experiments.weights): the same tensors as MiniMind's .pth, the tied
output projection stored once, loadable wherever a .pth is, and a damaged file refused naming it."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from common.minimind.model import build_model, load_native, read_native_state_dict, save_native
from common.minimind.spec import MiniMindArch, is_native_checkpoint
from common.user_errors import UserError
from experiments.weights import copy_weights, main

ARCH = MiniMindArch(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)


def test_a_pth_kept_as_safetensors_holds_the_same_tensors_and_loads_the_same_model(tmp_path, capsys):
    torch.manual_seed(0)
    save_native(build_model(ARCH), tmp_path / "w.pth")
    main([str(tmp_path / "w.pth"), str(tmp_path / "w.safetensors")])
    assert "read back equal" in capsys.readouterr().out
    before, after = read_native_state_dict(tmp_path / "w.pth"), read_native_state_dict(tmp_path / "w.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert after["lm_head.weight"].dtype == torch.float16  # MiniMind's dtype, not cast
    with safe_open(tmp_path / "w.safetensors", "pt") as stored:  # the tied projection once, named in the metadata
        assert "lm_head.weight" not in stored.keys() and stored.metadata() == {"tied": "lm_head.weight"}
    assert (tmp_path / "w.safetensors").stat().st_size < (tmp_path / "w.pth").stat().st_size + 4096
    assert is_native_checkpoint(str(tmp_path / "w.safetensors"))
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        logits = [load_native(tmp_path / name, ARCH)(ids).logits for name in ("w.pth", "w.safetensors")]
    assert torch.equal(*logits)


def test_a_damaged_safetensors_file_is_one_error_naming_it(tmp_path):
    torch.manual_seed(0)
    save_native(build_model(ARCH), tmp_path / "w.pth")
    copy_weights(tmp_path / "w.pth", tmp_path / "w.safetensors")
    (tmp_path / "w.safetensors").write_bytes((tmp_path / "w.safetensors").read_bytes()[:100])
    with pytest.raises(UserError, match=r"student checkpoint .*w.safetensors is not a readable safetensors file"):
        read_native_state_dict(tmp_path / "w.safetensors", role="student")
