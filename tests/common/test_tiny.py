"""``onpolicy-tiny``: a first run's files in one folder, and the commands it prints name them."""

from __future__ import annotations

import json

from common.minimind.tiny import SAMPLES, first_run_commands, write_first_run
from experiments.recipe.synthetic_task import write_task
from tests.helpers.paths import REPO_ROOT


def test_the_shipped_agent_data_is_what_the_task_generator_writes(tmp_path):
    """``opd/samples/`` is the recipe's task at seed 0 (8 training prompts, 4 held-out, 8 demonstrations), so it
    can be written again, not a hand-edited file: ``python -m experiments.recipe.synthetic_task --out DIR --train 8
    --distill 0 --heldout 4``."""
    write_task(tmp_path, train=8, heldout=4, distill=0, seed=0)
    for shipped, written in zip(SAMPLES, ("train_prompts", "heldout_prompts", "train_demonstrations"), strict=True):
        assert (REPO_ROOT / "opd" / "samples" / shipped).read_text() == (tmp_path / f"{written}.jsonl").read_text()
    heldout = [json.loads(line) for line in (REPO_ROOT / "opd" / "samples" / "tool_heldout.jsonl").open()]
    assert len(heldout) == 4 and all(record["gt"] for record in heldout)


def test_the_first_run_writes_its_files_and_prints_commands_naming_them(tmp_path, capsys):
    write_first_run(tmp_path / "tiny", seed=0)
    printed = capsys.readouterr().out
    names = sorted(path.name for path in (tmp_path / "tiny").iterdir())
    assert names == ["standin-tokenizer", "tiny_student.pth", "tiny_teacher.pth", *sorted(SAMPLES)]
    commands = first_run_commands(tmp_path / "tiny")
    assert all(f"  {command}" in printed for command in commands)
    assert f"data={tmp_path / 'tiny' / 'tool_prompts.jsonl'}" in commands[1]
    assert f"data={tmp_path / 'tiny' / 'tool_heldout.jsonl'}" in commands[2]
