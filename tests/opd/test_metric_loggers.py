"""The entries' metric loggers (opd/training/metric_loggers.py, logger.backends) and run log: TensorBoard's event file read
back equals metrics.jsonl step by step, W&B offline without network, a missing package or bad value is one error
line, only the logging process writes, Hydra's run log holds the step lines, the training-curve PNG, the ETA."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import logging
import re
import signal
import sys
import types

import numpy as np
import pytest

from common.config_schema import ConfigError
from common.user_errors import Interrupted, UserError
from experiments.recipe.synthetic_task import write_task
from opd.config import LoggerConfig, WandbConfig
from opd.reports.charts import write_training_curves
from opd.training.metric_loggers import MetricLoggers
from opd.training.train_log import TrainLog
from tests.helpers.charts import drawn_axes
from tests.helpers.configs import entry_config
from tests.helpers.opd_support import model_override, run_entry, write_agent_data

PNG = b"\x89PNG\r\n\x1a\n"


def logger_settings(*backends: str) -> LoggerConfig:
    return LoggerConfig(backends=list(backends), wandb=WandbConfig(project="opd-test", name=None, mode="offline"))


def scalars(folder) -> dict[str, dict[int, float]]:
    """Every scalar of the TensorBoard event files in ``folder``, read back with TensorBoard's own reader: tag ->
    step -> value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: {event.step: event.value for event in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def numbers(row: dict) -> dict[str, float]:
    """The numbers of a metrics.jsonl row a backend receives as scalars (not the step, booleans or None)."""
    return {key: value for key, value in row.items()
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)}


@pytest.fixture(scope="module")
def tensorboard_run(tmp_path_factory, tiny_pair):
    """``opd/train.py`` for 2 tiny steps with ``logger.backends=[jsonl,tensorboard]``, in this process."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed (pip install -e '.[dev]')")
    root = tmp_path_factory.mktemp("opd-logger")
    data = write_agent_data(root / "agent.jsonl", 4)
    result = run_entry("train", *tiny_pair, f"data={data}", "batch_size=2", "max_steps=2", "rollout.max_turns=1",
                       "rollout.max_gen_len=4", "rollout.max_total_len=1024", "device=cpu", f"out_dir={root / 'out'}",
                       f"hydra.run.dir={root / 'run'}", "logger.backends=[jsonl,tensorboard]")
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "run", result


def test_tensorboard_scalars_read_back_equal_metrics_jsonl_at_every_step(tensorboard_run):
    run, _ = tensorboard_run
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    read = scalars(run / "tensorboard")
    expected = {f"train/{key}" for row in rows for key in numbers(row)}
    assert {"train/loss", "train/lr", "train/tokens_per_s", "train/teacher_token_share"} <= expected
    assert set(read) == expected
    for row in rows:
        for key, value in numbers(row).items():  # TensorBoard keeps a scalar as float32
            assert read[f"train/{key}"][row["step"]] == np.float32(value), (key, row["step"])


def test_hydra_run_log_holds_the_step_lines_and_the_summary_lists_the_curves(tensorboard_run):
    run, result = tensorboard_run
    log = (run / "train.log").read_text()
    assert re.search(r"\[opd\]\[INFO\] - step 1  loss ", log) and re.search(r"\[opd\]\[INFO\] - step 2  loss ", log)
    assert "opd summary" in log and "training_curves.png" in log
    assert "step 2  loss " in result.stdout  # the console still shows them
    summary = json.loads((run / "summary.json").read_text())
    assert summary["curves"] == str(run / "training_curves.png")
    assert summary["tensorboard"] == str(run / "tensorboard")  # where `tensorboard --logdir` points (was not named)
    assert (run / "training_curves.png").read_bytes()[:8] == PNG


def test_evaluation_scores_go_to_the_loggers_at_log_step(tmp_path, tokenizer_path, tiny_checkpoints):
    """Each checkpoint's scores as eval/<name>/<metric> at log_step, the table in evaluate.log, and the progress
    display ends with the time elapsed and remaining."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed (pip install -e '.[dev]')")
    data = write_task(tmp_path / "task", train=2, heldout=2, seed=4)["files"]["heldout_prompts"]
    model = model_override("small", tiny_checkpoints["student"])
    run = tmp_path / "run"
    result = run_entry("evaluate", f"data={data}", f"tokenizer={tokenizer_path}", f"out_dir={tmp_path / 'eval'}",
                       f"hydra.run.dir={run}", "rollout.max_gen_len=4", "rollout.max_turns=1", "device=cpu",
                       "isolate=false", "chart=false", "log_step=40", model, "logger.backends=[tensorboard]")
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 40 and row["name"] == "small" and row["episodes"] == 2
    read = scalars(run / "tensorboard")
    assert set(read) == {f"eval/small/{key}" for key in numbers(row)}
    for key, value in numbers(row).items():
        assert read[f"eval/small/{key}"] == {40: np.float32(value)}, key
    assert "evaluation" in (run / "evaluate.log").read_text()
    assert re.search(r"eval small .* 2/2 .* \d+:\d\d:\d\d \d+:\d\d:\d\d", result.stdout), result.stdout


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """The real ``wandb`` package, offline: nothing leaves the machine, every file stays under ``tmp_path``."""
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install -e '.[wandb]'); "
                                                "W&B logging is untested here")
    for name, value in (("WANDB_MODE", "offline"), ("WANDB_DIR", str(tmp_path)), ("WANDB_SILENT", "true"),
                        ("WANDB_CONFIG_DIR", str(tmp_path / "config")), ("WANDB_CACHE_DIR", str(tmp_path / "cache"))):
        monkeypatch.setenv(name, value)
    return wandb


def test_wandb_offline_run_records_the_scalars_without_network(tmp_path, offline_wandb):
    rows = [{"step": 1, "loss": 2.5, "lr": 1e-3}, {"step": 2, "loss": 2.0, "lr": 5e-4}]
    with MetricLoggers(logger_settings("wandb"), tmp_path / "run", config={"seed": 1}) as loggers:
        run = loggers._wandb
        for row in rows:
            loggers.log(row, step=row["step"], prefix="train")
        # a step's row is committed when a later step arrives: step 1's scalars are the run's summary now
        assert (run.summary["train/loss"], run.summary["train/lr"]) == (2.5, 1e-3)
        assert run.settings.mode == "offline" and dict(run.config) == {"seed": 1}
    assert offline_wandb.run is None  # finished
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))


def test_wandb_marks_a_run_that_an_error_or_a_signal_ended_as_failed(tmp_path, monkeypatch):
    """Without an exit code W&B calls every finished run a success; the code is the one the run exits with. A stand-in
    ``wandb`` module records the calls, so this runs without the extra (the real one: the test below)."""
    finished = []

    class Run:
        def finish(self, exit_code=None):
            finished.append(exit_code)

    stand_in = types.ModuleType("wandb")
    stand_in.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # what LoggerConfig's check finds
    stand_in.init = lambda **settings: Run()
    monkeypatch.setitem(sys.modules, "wandb", stand_in)
    settings = logger_settings("wandb")
    with MetricLoggers(settings, tmp_path / "run"):
        pass
    endings = [(UserError("data: no such file"), 1), (RuntimeError("a bug"), 1), (KeyboardInterrupt(), 130),
               (Interrupted(signal.SIGTERM, "error: interrupted (SIGTERM)"), 143)]
    for error, _ in endings:
        with pytest.raises(type(error)), MetricLoggers(settings, tmp_path / "run"):
            raise error
    assert finished == [0] + [code for _, code in endings]


def test_wandb_offline_run_that_a_signal_ended_is_finished_with_its_exit_status(tmp_path, offline_wandb):
    with pytest.raises(Interrupted), MetricLoggers(logger_settings("wandb"), tmp_path / "run") as loggers:
        run = loggers._wandb
        loggers.log({"step": 1, "loss": 2.5}, step=1, prefix="train")
        raise Interrupted(signal.SIGTERM, "error: interrupted (SIGTERM)")
    assert run._exit_code == 143  # what W&B's finish recorded (its offline file holds it for `wandb sync`)


@pytest.mark.parametrize("entry,arguments", [
    ("train", ["data=agent.jsonl"]), ("sft", ["data=demonstrations.jsonl"]),
    ("evaluate", ["data=heldout.jsonl", "+model@models.small=tiny_student"]),
])
def test_a_backend_whose_package_is_missing_is_one_error_line_naming_the_extra(tmp_path, monkeypatch, entry,
                                                                                  arguments):
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "wandb" else found(name, *rest))
    result = run_entry(entry, *arguments, f"out_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'run'}",
                       "logger.backends=[jsonl,wandb]")
    assert result.returncode == 1 and result.stderr.splitlines() == [
        "error: logger.backends: wandb needs the wandb package, which is not installed: pip install -e '.[wandb]'"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("override,shown", [
    ("logger.backends=[jsonl,csv]", "error: logger.backends must be one of jsonl, tensorboard, wandb, got 'csv'"),
    ("logger.backends=[wandb] logger.wandb.mode=cloud",
     "error: logger.wandb.mode must be one of offline, online, shared, disabled, got 'cloud'"),
    ("logger.backends=jsonl", "error: logger.backends must be a list, as in logger.backends=[a,b]"),
])
def test_bad_logger_settings_are_one_error_line(tmp_path, override, shown):
    result = run_entry("train", "data=agent.jsonl", f"hydra.run.dir={tmp_path / 'run'}", *override.split())
    assert result.returncode == 1 and result.stderr.splitlines()[0] == shown, result.stderr[-2000:]


def test_wandb_mode_from_the_environment_is_checked_only_when_wandb_logs(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "dryrun")  # set for another tool
    assert entry_config("opd", ["data=agent.jsonl", "tokenizer=tok"]).logger.wandb.mode == "dryrun"
    with pytest.raises(ConfigError, match="logger.wandb.mode must be one of offline, online, shared, disabled, got 'dryrun'"):
        entry_config("opd", ["data=agent.jsonl", "tokenizer=tok", "logger.backends=[wandb]"])
    monkeypatch.delenv("WANDB_MODE")
    assert entry_config("opd", ["data=agent.jsonl", "tokenizer=tok"]).logger.wandb.mode == "offline"  # the default


def test_only_the_logging_process_writes(tmp_path):
    """Under torchrun every rank but 0 has ``enabled=False``: no metrics.jsonl, no event files."""
    settings = logger_settings("jsonl", "tensorboard")
    with TrainLog(tmp_path / "rank1", settings, total_steps=1, start_step=0, enabled=False) as log:
        log.step({"step": 1, "loss": 1.0, "tokens_per_s": 1.0, "mean_turns": 1.0, "truncated_fraction": 0.0,
                  "tool_calls": 0, "assistant_tokens": 1, "lr": 1e-3})
    assert not (tmp_path / "rank1").exists()


def test_without_matplotlib_the_curves_are_skipped_with_one_warning(tmp_path, monkeypatch, caplog):
    def missing():
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr("opd.reports.charts.pyplot", missing)
    with caplog.at_level(logging.WARNING, logger="opd"):
        assert write_training_curves([{"step": 1, "loss": 1.0}], tmp_path / "curves.png") is None
    assert [record.getMessage() for record in caplog.records] == [
        "warning: no training_curves.png: it needs matplotlib (pip install -e '.[chart]')"]
    assert not (tmp_path / "curves.png").exists()


def test_curves_panel_accuracy_only_where_measured(tmp_path):
    rows = [{"step": 1, "loss": 2.0, "lr": 1e-3, "tokens_per_s": 10.0, "answer_accuracy": None},
            {"step": 2, "loss": 1.5, "lr": 5e-4, "tokens_per_s": 12.0, "answer_accuracy": 0.5}]
    path, opened = drawn_axes(lambda: write_training_curves(rows, tmp_path / "curves.png"))
    assert path.read_bytes()[:8] == PNG
    (axes,) = opened
    assert [axis.get_title() for axis in axes[0]] == ["loss", "learning rate", "answer accuracy (graded episodes)",
                                                      "assistant tokens / s"]
    assert list(axes[0][2].lines[0].get_xdata()) == [2]
    without = write_training_curves([{"step": 1, "loss": 2.0, "lr": 1e-3, "tokens_per_s": 1.0}], tmp_path / "b.png")
    assert without.read_bytes()[:8] == PNG
    rows = [{**row, "broken_target_share": share} for row, share in zip(rows, (0.05, 0.4), strict=True)]
    _, opened = drawn_axes(lambda: write_training_curves(rows, tmp_path / "c.png"))
    (axes,) = opened
    assert axes[0][3].get_title() == "targets in broken turns" and list(axes[0][3].lines[0].get_ydata()) == [0.05, 0.4]
