"""The one atomic-write helper: whole-or-nothing replacement, permissions like a plain new file, no temp left."""

from __future__ import annotations

import json
import os
import stat

import pytest

from common.atomic_write import atomic_write, atomic_write_json, atomic_write_text


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_files_follow_the_umask_and_replacements_keep_the_target_mode(tmp_path):
    previous = os.umask(0o027)
    try:
        path = atomic_write_text(tmp_path / "a.txt", "one")
        assert mode(path) == 0o640 and path.read_text() == "one"
        path.chmod(0o604)
        atomic_write_json(path, {"ü": 1})
        assert mode(path) == 0o604 and json.loads(path.read_text(encoding="utf-8")) == {"ü": 1}
        assert "ü" in path.read_text(encoding="utf-8")  # non-ASCII kept as is
    finally:
        os.umask(previous)


def test_a_failing_writer_leaves_the_old_file_and_no_temp(tmp_path):
    path = atomic_write_text(tmp_path / "b.txt", "old")

    def fails(stream):
        stream.write(b"half")
        raise RuntimeError("writer broke")

    with pytest.raises(RuntimeError, match="writer broke"):
        atomic_write(path, fails)
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["b.txt"]
