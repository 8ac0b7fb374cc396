"""``--help`` of the Hydra entries: written from the YAML (keys, defaults, the comments beside them, groups with
their options), exit 0, and no group has to be chosen first (regen's ``dataset`` is required)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from common.entry_help import exit_with_help_if_asked, read_keys
from tests.helpers.paths import REPO_ROOT


def shown_keys(lines: list[str]) -> dict[str, str]:
    """``KEY=DEFAULT`` -> its meaning, from the help's key lines."""
    return {line.split()[0]: " ".join(line.split()[1:]) for line in lines
            if line.startswith("  ") and "=" in line.split()[0]}


def test_regen_help_from_another_folder_needs_no_dataset_and_lists_keys_with_their_meaning(tmp_path):
    result = subprocess.run([sys.executable, str(REPO_ROOT / "regen" / "main.py"), "--help"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    lines = result.stdout.splitlines()
    shown = shown_keys(lines)
    assert "  dataset (required): gsm8k, hermes-fc, local, magpie, nemotron, open-perfectblend, sample, sharegpt, " \
           "sharegpt4v-coco, ultrachat" in lines
    assert "  server (default vllm): external, local, vllm" in lines
    assert shown["max_tokens=8192"] == ("max_tokens of every request; at most the served model's max_model_len "
                                        "(checked at start)")
    assert shown["concurrency=auto"].endswith("a number: that many in flight at once, over all endpoints")  # 2 lines
    assert shown["server.model=???"].startswith("hub id or model folder vllm serves")  # the default server's keys
    assert shown["output_dir=out/regen"] == ""
    assert not any(key.startswith(("hydra", "defaults", "-")) for key in shown)
    assert list(tmp_path.iterdir()) == []  # nothing written: no outputs/ folder


def test_help_into_a_pipe_closed_early_is_no_traceback():
    command = f"{sys.executable} {REPO_ROOT / 'regen' / 'main.py'} --help | head -1"
    result = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.startswith("Response regeneration:")


def test_opd_help_lists_the_model_presets_for_teacher_and_student_and_the_logger_keys(capsys):
    with pytest.raises(SystemExit) as ended:
        exit_with_help_if_asked("opd", "opd/train.py", {"teacher": "model", "student": "model"}, argv=["x=1", "-h"])
    assert ended.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("  teacher (default agent_768): agent_512, agent_768,") for line in lines)
    assert any(line.startswith("  student (default full_sft_768): agent_512,") for line in lines)
    shown = shown_keys(lines)
    assert shown["data=???"].startswith("agent JSONL")
    assert shown["logger.backends=[jsonl]"].startswith("any of jsonl, tensorboard, wandb")  # the logger file's keys
    assert "teacher.hidden_size=768" in shown
    # the specified default, and the one override the study's evidence recommends for on-policy runs, with the option
    # that leaves broken turns out of the loss
    assert "On-policy, reverse_kl is the safe choice" in shown["loss.kl_direction=forward_kl"]
    assert "TRL's mask_truncated_completions" in shown["loss.mask_broken_turns=false"]


def test_help_shows_the_keys_of_the_options_chosen_on_the_command_line(capsys):
    """Before: ``server=local --help`` listed vLLM's keys (``server.model=???``, port 8000) and never
    ``dataset.path``; ``--cfg job`` was the only way to see them."""
    with pytest.raises(SystemExit):
        exit_with_help_if_asked("regen", "regen/main.py", argv=["server=local", "dataset=local", "max_tokens=5", "-h"])
    lines = capsys.readouterr().out.splitlines()
    assert "  server (default vllm, chosen local): external, local, vllm" in lines
    shown = shown_keys(lines)
    assert "dataset.path=???" in shown and "server.port=8011" in shown and "server.max_batch_size=32" in shown
    # the model preset the local server's defaults list merges in: its checkpoint and tokenizer
    assert "server.checkpoint=${tiny_checkpoint:tiny_teacher.pth}" in shown and "server.hidden_size=128" in shown
    assert not any(key.startswith(("server.model=???", "server.port=8000", "server.dp=")) for key in shown)
    with pytest.raises(SystemExit):
        exit_with_help_if_asked("opd", "opd/train.py", {"teacher": "model", "student": "model"},
                                argv=["teacher=tiny_teacher", "--help"])
    shown = shown_keys(capsys.readouterr().out.splitlines())
    assert "teacher.hidden_size=128" in shown and "student.hidden_size=768" in shown


def test_no_help_flag_goes_on_to_the_run(tmp_path):
    exit_with_help_if_asked("regen", "regen/main.py", argv=["dataset=sample", "--hydra-help"])
    exit_with_help_if_asked("regen", "regen/main.py", argv=["--help"], config_dir=tmp_path)  # no configs: Hydra's turn


def test_comments_keys_and_nesting_are_read_as_written(tmp_path):
    config = tmp_path / "entry.yaml"
    config.write_text("# The entry.\n# @package _global_\ndefaults:\n  - group: a  # pick one\n  - plain\n"
                      "  - override hydra/job_logging: x\nname: 'a # b'  # quoted\nurl: http://x/#frag\n"
                      "block:\n  inner: 1   # inner key\n            # continued\n  deep:\n    leaf: [1, 2]\n"
                      "after: 2\nhydra:\n  run: {dir: x}  # Hydra's\n")
    intro, keys, groups = read_keys(config)
    assert intro == ["The entry."]
    assert groups == [("group", "a", "pick one"), ("plain", None, "")]
    assert keys == [("name", "'a # b'", "quoted"), ("url", "http://x/#frag", ""),
                    ("block.inner", "1", "inner key continued"), ("block.deep.leaf", "[1, 2]", ""), ("after", "2", "")]
