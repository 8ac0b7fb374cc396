"""The wheel installs like a tool: ``pip install .`` (not editable) runs every entry from any folder.

The wheel is built once per session (``benchmarks.quick_start.build_and_install``: from a copy of the product's
files, installed, not editable, into a fresh venv that borrows this venv's dependencies); the entries run as the
console scripts ``pip`` wrote, from an empty folder that must stay empty when a run stops at its checks. The first
run from the wheel alone (``onpolicy-tiny`` and the commands it prints) takes about a minute on 2 cores.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
import yaml

from benchmarks.quick_start import PRODUCT, build_and_install
from tests.helpers.paths import CONFIG_DIR, REPO_ROOT
from tests.helpers.standin_vllm_cli import free_port

SCRIPTS = ("onpolicy-regen", "onpolicy-show-rows", "onpolicy-train", "onpolicy-sft", "onpolicy-evaluate",
           "onpolicy-serve", "onpolicy-tiny", "onpolicy-torchrun", "onpolicy-export-hf")


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
            done.write_text(json.dumps(build_and_install(folder)))
    return json.loads(done.read_text())


def run_script(installed: dict, name: str, *arguments: str, cwd: Path, **env_vars: str) -> subprocess.CompletedProcess:
    """The console script ``name`` as a person runs it: from ``cwd``, offline, with no tokenizer from the
    environment and no ``PYTHONPATH`` leading back to the checkout (``env_vars`` added)."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "MINIMIND_TOKENIZER", "ONPOLICY_TINY_DIR", "HYDRA_FULL_ERROR")}
    env["HOME"] = str(cwd.parent / "home")  # the tiny checkpoints' default folder is under the user's cache
    env.pop("XDG_CACHE_HOME", None)
    env.update(env_vars)
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


def without_matplotlib(folder: Path) -> str:
    """A ``PYTHONPATH`` folder whose ``matplotlib`` cannot be imported, as in an install without the chart extra."""
    (folder / "matplotlib").mkdir(parents=True)
    (folder / "matplotlib" / "__init__.py").write_text('raise ImportError("No module named \'matplotlib\'")\n')
    return str(folder)


def test_a_first_run_from_the_wheel_alone_needs_no_checkout_and_no_matplotlib(installed, tmp_path):
    """The commands ``onpolicy-tiny`` prints, run as printed from an empty folder. Before: ``server=local`` stopped at
    the missing tiny checkpoint with a hint to run ``make tiny`` (a checkout's), and ``onpolicy-evaluate`` without
    matplotlib ended in Hydra's traceback of an ImportError."""
    elsewhere, blocked = tmp_path / "elsewhere", without_matplotlib(tmp_path / "blocked")
    elsewhere.mkdir()
    tiny = run_script(installed, "onpolicy-tiny", cwd=elsewhere)
    assert tiny.returncode == 0 and tiny.stderr == "", tiny.stderr
    cache = tmp_path / "home" / ".cache" / "onpolicy-research" / "tiny"
    assert sorted(path.name for path in cache.iterdir()) == [
        "standin-tokenizer", "tiny_student.pth", "tiny_teacher.pth", "tool_demonstrations.jsonl",
        "tool_heldout.jsonl", "tool_prompts.jsonl"]
    commands = [shlex.split(line) for line in tiny.stdout.splitlines() if line.startswith("  onpolicy-")]
    assert [command[0] for command in commands] == ["onpolicy-regen", "onpolicy-train", "onpolicy-evaluate"]
    commands[0].append(f"server.port={free_port()}")  # the default 8011 may be another test's
    for name, *arguments in commands:
        ran = run_script(installed, name, *arguments, cwd=elsewhere, PYTHONPATH=blocked)
        assert ran.returncode == 0, ran.stderr
        assert "Traceback" not in ran.stderr + ran.stdout and "generated new fontManager" not in ran.stderr + ran.stdout
    rows = (elsewhere / "tiny-run" / "regen.jsonl").read_text().splitlines()
    assert len(rows) == len(Path(installed["site"], "regen", "samples", "sample_prompts.jsonl").read_text().splitlines())
    assert "warning:" in ran.stdout + ran.stderr and "matplotlib" in ran.stdout + ran.stderr  # the chart, left out
    evaluation = json.loads((elsewhere / "tiny-run" / "eval" / "evaluation.json").read_text())
    assert [result["name"] for result in evaluation["checkpoints"]] == ["before", "after"]
    assert not (elsewhere / "tiny-run" / "eval" / "evaluation.png").exists()
    # the tiny teacher as a folder vLLM would serve, from the wheel's own preset and cache
    exported = run_script(installed, "onpolicy-export-hf", "--model", "tiny_teacher", "--out", "tiny-run/teacher-hf",
                          cwd=elsewhere)
    assert exported.returncode == 0 and (elsewhere / "tiny-run" / "teacher-hf" / "model.safetensors").is_file()
    # nothing outside the named outputs and Hydra's run folders (before: out/servers/local-8011.log)
    assert sorted(path.name for path in elsewhere.iterdir()) == ["outputs", "tiny-run"]


def test_installed_typos_are_refused_before_torch_is_imported(installed, tmp_path):
    """Before: every ``onpolicy-train`` config error took 6-8 s on 2 cores (torch imported first); regen's about 1 s."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("onpolicy-train", "onpolicy-sft", "onpolicy-evaluate"):
        ran = run_script(installed, name, "batch_sise=4", cwd=elsewhere, PYTHONPROFILEIMPORTTIME="1")
        assert ran.returncode == 1 and "error: unknown setting batch_sise" in ran.stderr, ran.stderr
        imported = {line.split("|")[-1].strip() for line in ran.stderr.splitlines() if line.startswith("import time:")}
        assert "hydra" in imported and "torch" not in imported  # the import log: the check ran, torch never loaded
    served = run_script(installed, "onpolicy-serve", "--checkpoint", "c.pth", "--port", "99999", cwd=elsewhere,
                        PYTHONPROFILEIMPORTTIME="1")
    assert served.returncode == 2 and "argument --port: not a port (1 to 65535): 99999" in served.stderr
    assert "torch" not in {line.split("|")[-1].strip() for line in served.stderr.splitlines()}
    checked = run_script(installed, "onpolicy-train", "data=x.jsonl", "device=gpu", cwd=elsewhere,
                         PYTHONPROFILEIMPORTTIME="1")
    assert "error: device must be auto, cpu, cuda or cuda:N, got 'gpu'" in checked.stderr, checked.stderr
    assert "torch" not in {line.split("|")[-1].strip() for line in checked.stderr.splitlines()}
    # torchrun from the install: -m opd.train (no opd/train.py outside a checkout) reaches the same check
    launched = run_script(installed, "onpolicy-torchrun", "--nproc-per-node", "1", "-m", "opd.train", "batch_sise=4",
                          cwd=elsewhere)
    assert launched.returncode == 1 and "error: unknown setting batch_sise" in launched.stderr, launched.stderr
    assert "Traceback" not in launched.stderr
    assert list(elsewhere.iterdir()) == []
