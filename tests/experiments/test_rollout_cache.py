"""The teacher's rollouts a seed's KD arms distil, kept in the run folder (experiments.study.rollout_cache): restored
under the name opd/train.py looks up, and checked unchanged after the run that read them."""

from __future__ import annotations

import json

import pytest

from experiments.study.rollout_cache import check, keep, restore
from opd.rollouts.teacher_rollouts import CACHE_FORMAT, TeacherRolloutCache

KEY = {"data.sha256": "d", "teacher.checkpoint_sha256": "t", "seed": 0}


def write_cache(folder, data) -> TeacherRolloutCache:
    cache = TeacherRolloutCache(folder, data, KEY)
    cache.path.parent.mkdir(parents=True)
    cache.path.write_text(json.dumps({"format": CACHE_FORMAT, "key": KEY}) + "\n" + '{"index": 0}\n')
    return cache


def test_kept_rollouts_are_restored_where_the_trainer_reads_them_and_checked_after(tmp_path):
    data = tmp_path / "distill_prompts.jsonl"
    made = write_cache(tmp_path / "first", data)
    keep(tmp_path / "first", tmp_path / "kept.jsonl.gz")
    restored = restore(tmp_path / "kept.jsonl.gz", tmp_path / "second", data)
    assert restored == TeacherRolloutCache(tmp_path / "second", data, KEY).path
    assert restored.read_bytes() == made.path.read_bytes()
    check(tmp_path / "kept.jsonl.gz", tmp_path / "second")
    restored.write_text(restored.read_text() + '{"index": 1}\n')  # the run generated episodes of its own
    with pytest.raises(SystemExit, match="is no longer the one kept in"):
        check(tmp_path / "kept.jsonl.gz", tmp_path / "second")
    with pytest.raises(SystemExit, match="exists and differs from"):
        restore(tmp_path / "kept.jsonl.gz", tmp_path / "second", data)


def test_a_folder_without_exactly_one_cache_file_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="holds 0 teacher-rollout cache files, not one"):
        keep(tmp_path / "empty", tmp_path / "kept.jsonl.gz")
