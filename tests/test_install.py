"""The wheel installs like a tool: ``pip install .`` (not editable) runs every entry from any folder.

The wheel is built once per session from a copy of the product's files (a build writes ``build/`` beside its
sources), then installed, not editable, into a fresh venv that borrows this venv's dependencies; the entries run
as the console scripts ``pip`` wrote, from an empty folder that must stay empty when a run stops at its checks.
About 10 s on a 2-core machine, most of it the one opd run (``import torch``).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.helpers.paths import CONFIG_DIR, REPO_ROOT

PRODUCT = ("common", "regen", "opd", "tools", "launch")
SCRIPTS = ("onpolicy-regen", "onpolicy-show-rows", "onpolicy-train", "onpolicy-sft", "onpolicy-evaluate",
           "onpolicy-serve", "onpolicy-torchrun")


def _build_and_install(folder: Path) -> dict:
    source = folder / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, source / name)
    for name in ("configs", *PRODUCT):
        shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(folder / "dist"), str(source)],
                   check=True, capture_output=True, timeout=300)
    wheel = next((folder / "dist").glob("onpolicy_research-*.whl"))
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    # the dependencies (torch, hydra, ...) from this venv: a path a .pth adds is searched, its own .pth files are not
    # read, so this venv's editable install of the checkout stays out
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    return {"wheel": str(wheel), "bin": str(venv / "bin"), "site": str(site)}


@pytest.fixture(scope="session")
def installed(tmp_path_factory) -> dict:
    """``{"wheel", "bin", "site"}`` of the session's wheel and its install; built once even under pytest-xdist (the
    workers share the session's temporary folder, and the first one builds under a lock)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # pytest-N/, the session's, above each worker's popen-gwN/
    folder, done = shared / "installed-wheel", shared / "installed-wheel.json"
    with open(shared / "installed-wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            done.write_text(json.dumps(_build_and_install(folder)))
    return json.loads(done.read_text())


def run_script(installed: dict, name: str, *arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    """The console script ``name`` as a person runs it: from ``cwd``, offline, with no tokenizer from the
    environment and no ``PYTHONPATH`` leading back to the checkout."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "MINIMIND_TOKENIZER", "ONPOLICY_TINY_DIR", "HYDRA_FULL_ERROR")}
    env["HOME"] = str(cwd.parent / "home")  # the tiny checkpoints' default folder is under the user's cache
    env.pop("XDG_CACHE_HOME", None)
    return subprocess.run([str(Path(installed["bin"]) / name), *arguments], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_wheel_ships_the_configs_and_the_sample_under_the_project_package_and_no_top_level_configs(installed):
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {*PRODUCT, "onpolicy_research"}  # no `configs` package beside them
    configs = {str(path.relative_to(CONFIG_DIR)) for path in CONFIG_DIR.rglob("*.yaml")}
    assert {name.removeprefix("onpolicy_research/configs/") for name in names
            if name.startswith("onpolicy_research/")} == configs
    assert "regen/samples/sample_prompts.jsonl" in names and "launch/vllm.sh" in names
    python = {str(path.relative_to(REPO_ROOT)) for package in PRODUCT for path in (REPO_ROOT / package).rglob("*.py")
              if "__pycache__" not in path.parts}
    assert python <= set(names), sorted(python - set(names))  # pyproject's package list misses no folder
    entry_points = next(name for name in names if name.endswith(".dist-info/entry_points.txt"))
    scripts = zipfile.ZipFile(installed["wheel"]).read(entry_points).decode()
    assert sorted(line.split(" = ")[0] for line in scripts.splitlines() if " = " in line) == sorted(SCRIPTS)


def test_installed_entries_answer_help_and_regen_finds_its_sample_from_another_folder(installed, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    helped = run_script(installed, "onpolicy-regen", "--help", cwd=elsewhere)
    assert helped.returncode == 0 and helped.stderr == "", helped.stderr
    assert "usage: onpolicy-regen [KEY=VALUE ...]" in helped.stdout
    assert "  dataset (required): gsm8k, hermes-fc, local, magpie," in helped.stdout
    composed = run_script(installed, "onpolicy-regen", "dataset=sample", "server=local", "--cfg", "job", "--resolve",
                          cwd=elsewhere)
    assert composed.returncode == 0, composed.stderr
    cfg = yaml.safe_load(composed.stdout)
    sample = Path(cfg["dataset"]["path"])  # shipped in the installed regen package, not looked for in this folder
    assert sample == Path(installed["site"]) / "regen" / "samples" / "sample_prompts.jsonl" and sample.is_file()
    # the tiny presets' checkpoints: the user's cache folder, since no checkout is there to hold out/tiny
    assert cfg["server"]["checkpoint"] == str(tmp_path / "home" / ".cache" / "onpolicy-research" / "tiny" /
                                              "tiny_teacher.pth")
    mine = tmp_path / "mine" / "dataset"  # a person's own config folder adds to the shipped ones
    mine.mkdir(parents=True)
    (mine / "mine.yaml").write_text("name: mine\nsource: local\npath: prompts.jsonl\nsubset: null\nsplit: null\n"
                                    "format: auto\n")
    composed = run_script(installed, "onpolicy-regen", "--config-dir", str(mine.parent), "dataset=mine",
                          "sampling=greedy", "--cfg", "job", cwd=elsewhere)
    assert composed.returncode == 0, composed.stderr
    cfg = yaml.safe_load(composed.stdout)
    assert cfg["dataset"]["path"] == "prompts.jsonl" and cfg["sampling"]["temperature"] == 0
    launcher = run_script(installed, "onpolicy-torchrun", "--help", cwd=elsewhere)
    assert launcher.returncode == 0 and "--nproc-per-node" in launcher.stdout, launcher.stderr
    shown = run_script(installed, "onpolicy-show-rows", "--help", cwd=elsewhere)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: onpolicy-show-rows"), shown.stderr
    for name, group in (("train", "  teacher (default agent_768): agent_512,"), ("sft", "  model (default"),
                        ("evaluate", "  sampling (default greedy):")):  # written from the YAML, before torch loads
        helped = run_script(installed, f"onpolicy-{name}", "-h", cwd=elsewhere)
        assert helped.returncode == 0 and f"usage: onpolicy-{name} [KEY=VALUE ...]" in helped.stdout, helped.stderr
        assert group in helped.stdout, helped.stdout
    assert os.access(Path(installed["site"]) / "launch" / "vllm.sh", os.X_OK)  # server=vllm runs it installed too
    assert list(elsewhere.iterdir()) == []


def test_installed_runs_that_stop_at_their_checks_leave_no_folder_where_they_ran(installed, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the sample is read, then no server answers at the endpoint (port 1): before this change the run stopped at
    # `dataset file not found: regen/samples/sample_prompts.jsonl` and left outputs/regen/DATE/TIME/ here
    regen = run_script(installed, "onpolicy-regen", "dataset=sample", "server=external",
                       "server.endpoints=[http://127.0.0.1:1]", cwd=elsewhere)
    assert regen.returncode == 1 and "error: no endpoint answers /v1/models" in regen.stderr, regen.stderr
    assert "Traceback" not in regen.stderr
    # a relative path typed on the command line is the folder's own; opd makes and locks out/agent_opd before it
    # reads the data, and takes both back when the data is missing
    train = run_script(installed, "onpolicy-train", "data=missing.jsonl", "tokenizer=tok", "teacher=tiny_teacher",
                       "student=tiny_student", cwd=elsewhere)
    assert train.returncode == 1 and "error: agent data file not found: missing.jsonl" in train.stderr, train.stderr
    assert "Traceback" not in train.stderr
    assert list(elsewhere.iterdir()) == []  # no outputs/, no out/
