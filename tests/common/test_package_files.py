"""The project's own files are found from the package, never from the folder a run starts in: the config tree, the
sample of ``dataset=sample`` and the tiny checkpoints' folder (``common/package_files.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from common import package_files
from common.package_files import CONFIG_DIR, package_data, tiny_dir
from tests.helpers.configs import compose_config
from tests.helpers.paths import REPO_ROOT


def test_a_checkout_reads_its_own_configs_folder():
    assert package_files.checkout_root() == REPO_ROOT and CONFIG_DIR == REPO_ROOT / "configs"


def test_the_sample_preset_names_the_shipped_file_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # before: dataset.path=regen/samples/sample_prompts.jsonl, looked for here
    path = Path(compose_config("regen", ["dataset=sample"]).dataset.path)
    assert path == REPO_ROOT / "regen" / "samples" / "sample_prompts.jsonl" and path.is_file()
    typed = compose_config("regen", ["dataset=local", "dataset.path=mine.jsonl"]).dataset.path
    assert typed == "mine.jsonl"  # what a person types stays relative to the folder they run from


def test_package_data_wants_a_package_and_a_path():
    assert package_data("regen/samples/sample_prompts.jsonl") == str(REPO_ROOT / "regen/samples/sample_prompts.jsonl")
    with pytest.raises(ValueError, match="expected PACKAGE/PATH"):
        package_data("regen")


def test_tiny_presets_look_in_the_tiny_folder_the_environment_or_the_checkout_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # before: out/tiny/tiny_teacher.pth, looked for here
    monkeypatch.delenv("ONPOLICY_TINY_DIR", raising=False)
    assert tiny_dir() == REPO_ROOT / "out" / "tiny"
    assert compose_config("opd", ["data=x", "teacher=tiny_teacher"]).teacher.checkpoint == str(
        REPO_ROOT / "out" / "tiny" / "tiny_teacher.pth")
    monkeypatch.setenv("ONPOLICY_TINY_DIR", "elsewhere")
    assert compose_config("sft", ["data=x", "model=tiny_student"]).model.checkpoint == str(
        tmp_path / "elsewhere" / "tiny_student.pth")


def test_an_installed_package_keeps_tiny_checkpoints_in_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(package_files, "checkout_root", lambda: None)  # as in site-packages
    monkeypatch.delenv("ONPOLICY_TINY_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert tiny_dir() == tmp_path / "cache" / "onpolicy-research" / "tiny"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tiny_dir() == tmp_path / "home" / ".cache" / "onpolicy-research" / "tiny"
