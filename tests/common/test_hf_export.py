"""``onpolicy-export-hf``: a native MiniMind checkpoint as the HF Qwen3 folder vLLM serves, logits unchanged."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.minimind.hf_export import command, export, preset_spec
from common.minimind.model import build_model, load_model, save_native
from common.user_errors import UserError
from tests.helpers.entries import run_main


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_the_exported_folder_gives_the_native_models_logits_and_tokenizer(tmp_path, tokenizer_path):
    torch.manual_seed(3)
    spec = preset_spec("tiny_teacher", str(tmp_path / "teacher.pth"), str(tokenizer_path))
    save_native(build_model(spec.arch), spec.checkpoint)
    out = export(spec, tmp_path / "hf")
    native, tokenizer = load_model(spec)
    served = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert type(served).__name__ == "Qwen3ForCausalLM"
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    assert torch.equal(_logits(native, ids), _logits(served, ids))  # fp16 files both: nothing rounded
    exported = AutoTokenizer.from_pretrained(out)
    assert exported.get_vocab() == tokenizer.get_vocab() and exported.chat_template == tokenizer.chat_template
    assert sorted(path.name for path in tmp_path.iterdir()) == ["hf", "teacher.pth"]  # no staging folder left


def test_a_moe_checkpoint_keeps_the_per_expert_names_vllm_reads(tmp_path, tokenizer_path):
    spec = preset_spec("agent_768_moe", str(tmp_path / "moe.pth"), str(tokenizer_path))
    spec.hidden_size, spec.num_hidden_layers = 64, 1
    torch.manual_seed(0)
    save_native(build_model(spec.arch), spec.checkpoint)
    out = export(spec, tmp_path / "hf", dtype="float32")
    with safe_open(out / "model.safetensors", "pt") as weights:
        experts = sorted(key for key in weights.keys() if ".experts." in key)
    assert experts[:3] == [f"model.layers.0.mlp.experts.0.{kind}_proj.weight" for kind in ("down", "gate", "up")]
    assert len(experts) == 3 * spec.num_experts
    served = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert torch.equal(_logits(load_model(spec)[0], [5, 6, 7]), _logits(served, [5, 6, 7]))


@pytest.mark.parametrize(("arguments", "expected"), [
    (["--model", "nope"], "error: --model nope: no such preset (one of: agent_512, "),
    (["--model", "tiny_teacher", "--checkpoint", "some/hf-folder"], "error: --checkpoint some/hf-folder is not a native MiniMind .pth"),
    (["--model", "tiny_teacher", "--checkpoint", "missing.pth"], "error: model checkpoint not found: missing.pth"),
])
def test_bad_arguments_are_one_error_line(tmp_path, tokenizer_path, arguments, expected):
    ran = run_main(command, *arguments, "--tokenizer", str(tokenizer_path), "--out", str(tmp_path / "hf"), cwd=tmp_path,
                   hydra=False)
    assert ran.returncode == 1 and ran.stderr.startswith(expected) and "Traceback" not in ran.stderr
    assert not (tmp_path / "hf").exists()


def test_an_existing_folder_is_replaced_only_when_asked(tmp_path, tokenizer_path):
    spec = preset_spec("tiny_teacher", str(tmp_path / "teacher.pth"), str(tokenizer_path))
    save_native(build_model(spec.arch), spec.checkpoint)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "keep").write_text("mine")
    ran = run_main(command, "--model", "tiny_teacher", "--checkpoint", spec.checkpoint, "--tokenizer",
                   str(tokenizer_path), "--out", str(tmp_path / "hf"), cwd=tmp_path,
                   hydra=False)
    assert ran.returncode == 1 and "exists" in ran.stderr and (tmp_path / "hf" / "keep").read_text() == "mine"
    with pytest.raises(UserError, match=r"is not an HF model folder this command wrote \(no config.json\)"):
        export(spec, tmp_path / "hf", overwrite=True)  # a folder of the user's, not an export: kept
    assert (tmp_path / "hf" / "keep").read_text() == "mine"
    (tmp_path / "hf" / "keep").unlink()
    (tmp_path / "hf").rmdir()
    export(spec, tmp_path / "hf")
    (tmp_path / "hf" / "stale").write_text("old")
    export(spec, tmp_path / "hf", overwrite=True)  # an earlier export is replaced
    assert not (tmp_path / "hf" / "stale").exists() and (tmp_path / "hf" / "config.json").is_file()


def test_overwrite_never_replaces_a_folder_holding_the_working_folder_or_an_input(tmp_path, tokenizer_path):
    """``--out .. --overwrite`` from deep/inner once deleted all of deep/, the working folder with it."""
    deep = tmp_path / "deep"
    (deep / "inner").mkdir(parents=True)
    (deep / "config.json").write_text("{}")  # even a folder that looks like an export
    (deep / "notes.txt").write_text("mine")
    spec = preset_spec("tiny_teacher", str(tmp_path / "teacher.pth"), str(tokenizer_path))
    save_native(build_model(spec.arch), spec.checkpoint)
    ran = run_main(command, "--model", "tiny_teacher", "--checkpoint", spec.checkpoint, "--tokenizer",
                   str(tokenizer_path), "--out", "..", "--overwrite", cwd=deep / "inner", hydra=False)
    assert ran.returncode == 1 and "holds the working folder or an input" in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr and (deep / "notes.txt").read_text() == "mine" and (deep / "inner").is_dir()
    spec.checkpoint = str(deep / "teacher.pth")
    save_native(build_model(spec.arch), spec.checkpoint)
    with pytest.raises(UserError, match=r"holds the working folder or an input \(.*teacher.pth\)"):
        export(spec, deep, overwrite=True)
    assert (deep / "teacher.pth").is_file()
