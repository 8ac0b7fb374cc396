"""Hydra's refusals of a command line as one or two ``error:`` lines: each message from the real exception the
installed Hydra raises on the shipped configs, the wrapped ``hydra.main`` raising it as a ``UserError`` (and leaving
every other error to Hydra), and a real entry from the command line."""

from __future__ import annotations

import subprocess
import sys

import hydra
import pytest
from hydra._internal import utils as hydra_utils
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import CompactHydraException

from common.hydra_errors import HELP, composition_error, composition_errors_as_user_errors
from common.package_files import CONFIG_DIR
from common.user_errors import UserError, error_lines
from tests.helpers.paths import REPO_ROOT

DATASETS = "gsm8k, hermes-fc, local, magpie, nemotron, open-perfectblend, sample, sharegpt, sharegpt4v-coco, ultrachat"
MODELS = "agent_512, agent_768, agent_768_moe, full_sft_512, full_sft_768, full_sft_768_moe, tiny_student, tiny_teacher"
GRAMMAR = "error: its grammar: https://hydra.cc/docs/advanced/override_grammar/basic/"


def refusal(config: str, overrides: list[str]) -> CompactHydraException:
    """What the installed Hydra raises composing the shipped ``config`` with ``overrides``."""
    if config == "opd":  # its teacher and student groups are the model presets, stored as opd/train.py does
        from opd.config import register_model_groups

        register_model_groups()
    GlobalHydra.instance().clear()
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"), \
            pytest.raises(CompactHydraException) as caught:
        hydra.compose(config, overrides=overrides)
    return caught.value


@pytest.mark.parametrize(("config", "overrides", "expected"), [
    ("regen", ["dataset=nope"], ["error: dataset=nope: dataset has no option 'nope'",
                                 f"error: dataset is one of: {DATASETS}"]),
    ("regen", ["server.dp=2"], ["error: dataset must be chosen (dataset=<OPTION>)",
                                f"error: dataset is one of: {DATASETS}"]),
    ("regen", ["dataset=magpie", "server.dpx=2"], ["error: unknown setting server.dpx", f"error: {HELP}"]),
    ("opd", ["dataset=magpie"], ["error: unknown setting dataset", f"error: {HELP}"]),  # no such group in opd
    ("opd", ["teacher="], ["error: teacher= names no option", f"error: teacher is one of: {MODELS}"]),
    ("sft", ["batch_sise=3"], ["error: unknown setting batch_sise", f"error: {HELP}"]),
    ("sft", ["+seed=3"], ["error: +seed adds a setting that is already there",
                          "error: to change it, leave out the +: seed=3"]),
    ("sft", ["~nope"], ["error: Could not delete from config. 'nope' does not exist."]),
    ("sft", ["seed=[1"], ["error: cannot read the override 'seed=[1': no viable alternative at input '[1'", GRAMMAR]),
    ("sft", ["seed=1)"], ["error: cannot read the override 'seed=1)': extraneous input ')' expecting <EOF>", GRAMMAR]),
    ("sft", ["seed='x"], ["error: cannot read the override \"seed='x\": cannot read on from \"'x\"", GRAMMAR]),
    ("sft", ["seed=3,\"4"], ["error: cannot read the override 'seed=3,\"4': cannot read on from '\"4'", GRAMMAR]),
])
def test_each_refusal_is_one_or_two_error_lines(config, overrides, expected):
    assert error_lines(composition_error(refusal(config, overrides))) == expected


def run_hydra_main(argv: list[str], task, monkeypatch) -> None:
    """``hydra.main`` over the shipped sft config with ``argv``, as an entry runs it."""
    monkeypatch.setattr(sys, "argv", ["sft", *argv])
    GlobalHydra.instance().clear()
    hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="sft")(task)()


def test_hydra_main_raises_the_user_error_and_is_restored_after(monkeypatch, capsys):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    report = hydra_utils.run_and_report
    ran = []
    with composition_errors_as_user_errors(), pytest.raises(UserError) as caught:
        run_hydra_main(["batch_sise=3", "hydra.run.dir=."], ran.append, monkeypatch)
    assert error_lines(caught.value) == ["error: unknown setting batch_sise", f"error: {HELP}"]
    assert ran == [] and capsys.readouterr().err == ""  # Hydra printed nothing of its own
    assert hydra_utils.run_and_report is report


def test_a_good_command_line_runs_the_task_and_other_errors_stay_hydras(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    ran = []
    with composition_errors_as_user_errors():
        run_hydra_main(["seed=7", f"hydra.run.dir={tmp_path}"], lambda cfg: ran.append(cfg.seed), monkeypatch)
    assert ran == [7]

    def bug(cfg):
        raise RuntimeError("a bug in the task")

    with composition_errors_as_user_errors(), pytest.raises(SystemExit) as caught:
        run_hydra_main([f"hydra.run.dir={tmp_path}"], bug, monkeypatch)
    assert caught.value.code == 1
    assert "RuntimeError: a bug in the task" in capsys.readouterr().err  # Hydra's own report of it


def test_hydra_full_error_leaves_hydra_alone(monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with composition_errors_as_user_errors(), pytest.raises(CompactHydraException, match="Could not override"):
        run_hydra_main(["batch_sise=3"], print, monkeypatch)


def test_an_entry_given_a_group_option_that_does_not_exist_says_two_lines(tmp_path):
    result = subprocess.run([sys.executable, str(REPO_ROOT / "regen" / "main.py"), "dataset=nope"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines() == ["error: dataset=nope: dataset has no option 'nope'",
                                          f"error: dataset is one of: {DATASETS}"]
    assert list(tmp_path.iterdir()) == []
