"""The typed settings schema: every bad value stops the run at start with a message naming the key."""

from __future__ import annotations

import pytest

from common.config_schema import ConfigError
from common.package_files import tiny_dir
from opd.config import LossConfig, OptimConfig, RolloutConfig, SamplingConfig
from tests.helpers.configs import entry_config
from tests.helpers.opd_support import run_entry

BASE = ["data=agent.jsonl", "tokenizer=tok", "device=cpu"]


@pytest.mark.parametrize("override,message", [
    ("batch_size=0", "batch_size must be an integer >= 1, got 0"),
    ("max_steps=0", "max_steps must be an integer >= 1 or null, got 0"),
    ("optim.learning_rate=-1", "optim.learning_rate must be a positive number, got -1.0"),
    ("optim.learning_rate=nan", "optim.learning_rate must be a positive number, got nan"),
    ("optim.warmup_steps=-2", "optim.warmup_steps must be an integer >= 0, got -2"),
    ("optim.grad_clip=0", "optim.grad_clip must be null or > 0, got 0.0"),
    ("rollout.max_gen_len=0", "rollout.max_gen_len must be an integer >= 1, got 0"),
    ("loss.temperature=0", "loss.temperature must be a number > 0, got 0.0"),
    ("sampling.top_p=1.5", "sampling.top_p must be in (0, 1], got 1.5"),
    ("mode=both", "mode must be one of on_policy, offline, got 'both'"),
    ("device=tpu", "device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
    ("dtype=int8", "dtype must be auto or one of float32, bfloat16, float16, got 'int8'"),
    ("dtype=float16", "dtype=float16 needs CUDA"),
    ("teacher.hidden_size=wide", "teacher.hidden_size must be an integer or null, got 'wide'"),
    ("+optim.momentum=0.9", "unknown setting optim.momentum"),
    ("offline.dataset_num_proc=0", "offline.dataset_num_proc must be auto or an integer >= 1, got 0"),
    ("offline.dataset_num_proc=all", "offline.dataset_num_proc must be auto or an integer >= 1, got 'all'"),
])
def test_each_bad_value_names_its_key(override, message):
    with pytest.raises(ConfigError) as caught:
        entry_config("opd", [*BASE, override])
    assert message in str(caught.value)


def test_a_missing_required_value_is_named():
    with pytest.raises(ConfigError, match="data"):
        entry_config("opd", ["tokenizer=tok"])


def test_blocks_become_the_objects_that_use_them():
    cfg = entry_config("opd", [*BASE, "sampling.seed=7", "rollout.max_turns=5"])
    assert isinstance(cfg.rollout, RolloutConfig) and cfg.rollout.max_turns == 5
    assert isinstance(cfg.loss, LossConfig) and isinstance(cfg.optim, OptimConfig)
    assert isinstance(cfg.sampling, SamplingConfig) and cfg.sampling.seed_or(42) == 7
    assert SamplingConfig().seed_or(42) == 42
    assert cfg.teacher.tokenizer == cfg.student.tokenizer == "tok"  # the presets' ${tokenizer}
    assert entry_config("evaluate", [*BASE, "models={m: {checkpoint: x.pth}}"]).models["m"].tokenizer == "tok"
    assert cfg.precision.device.type == "cpu" and cfg.precision.dtype_name == "float32"


@pytest.mark.parametrize("entry,overrides,key,checkpoint", [
    ("opd", ["data=agent.jsonl"], "teacher", "out/agent_768.pth"),
    ("sft", ["data=demos.jsonl", "model=full_sft_768"], "model", "out/full_sft_768.pth"),
    ("evaluate", ["data=heldout.jsonl", "+model@models.small=agent_512"], "models.small", "out/agent_512.pth"),
])
def test_a_missing_tokenizer_names_the_key_a_person_types(entry, overrides, key, checkpoint):
    """Every model block takes the entry's ``tokenizer=``: that is the key to name, not ``student.tokenizer``."""
    with pytest.raises(ConfigError) as caught:
        entry_config(entry, [*overrides, "device=cpu"])
    assert caught.value.message == f"tokenizer is not set, and {key}.checkpoint={checkpoint} holds none (a MiniMind .pth)"
    assert caught.value.hint.startswith("pass tokenizer=PATH ")


def test_the_tiny_presets_use_the_standin_tokenizer_beside_their_checkpoints_unless_one_is_named():
    """Before: a tiny run needed ``tokenizer=out/tiny/standin-tokenizer``, a path only a checkout has."""
    tiny = ["data=agent.jsonl", "teacher=tiny_teacher", "student=tiny_student", "device=cpu"]
    cfg = entry_config("opd", tiny)
    assert cfg.teacher.tokenizer == cfg.student.tokenizer == str(tiny_dir() / "standin-tokenizer")
    assert entry_config("opd", [*tiny, "tokenizer=tok"]).student.tokenizer == "tok"


def test_a_missing_tokenizer_is_two_error_lines(tmp_path):
    result = run_entry("train", "data=agent.jsonl", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 1 and result.stderr.splitlines() == [
        "error: tokenizer is not set, and teacher.checkpoint=out/agent_768.pth holds none (a MiniMind .pth)",
        "error: pass tokenizer=PATH (your MiniMind checkout's tokenizer folder, or a hub id) or export "
        "MINIMIND_TOKENIZER (`onpolicy-tiny` writes a stand-in one, which the tiny presets use)"]


def test_an_hf_model_needs_no_tokenizer_setting():
    """An HF folder or hub id as checkpoint brings its own tokenizer."""
    cfg = entry_config("evaluate", ["data=heldout.jsonl", "models={m: {checkpoint: org/model}}", "device=cpu"])
    assert cfg.models["m"].tokenizer is None
