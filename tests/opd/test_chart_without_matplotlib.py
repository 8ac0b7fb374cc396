"""Without matplotlib (an optional extra) a chart is one warning line naming the install command, and the evaluation
goes on without its PNG (it stopped in a Hydra traceback: ``ImportError: the chart needs matplotlib``)."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from common.package_files import extras_install
from experiments.recipe.synthetic_task import write_task
from opd.evaluate import evaluate
from opd.reports.charts import chart_pyplot
from tests.helpers.configs import entry_config
from tests.helpers.opd_support import model_override

WARNING = "warning: no evaluation.png: it needs matplotlib ({}, or set chart=false)"


@pytest.fixture
def no_matplotlib(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError


def warnings(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


def test_the_chart_is_none_with_one_warning_line(no_matplotlib, caplog):
    with caplog.at_level(logging.WARNING, logger="opd"):
        assert chart_pyplot("evaluation.png", turn_off=", or set chart=false") is None
    assert warnings(caplog) == [WARNING.format(extras_install("chart"))]


def test_evaluate_writes_its_report_without_the_chart(no_matplotlib, caplog, tmp_path, tiny_checkpoints,
                                                      tokenizer_path):
    data = write_task(tmp_path / "task", train=2, heldout=2, seed=4)["files"]["heldout_prompts"]
    model = model_override("small", tiny_checkpoints["student"])
    out = tmp_path / "eval"
    cfg = entry_config("evaluate", [f"data={data}", f"tokenizer={tokenizer_path}", f"out_dir={out}", "device=cpu",
                                    "isolate=false", "rollout.max_gen_len=4", "rollout.max_turns=1", model])
    assert cfg.chart  # the default
    with caplog.at_level(logging.INFO, logger="opd"):
        report = evaluate(cfg)
    assert warnings(caplog) == [WARNING.format(extras_install("chart"))]
    assert report["chart"] is None and json.loads((out / "evaluation.json").read_text())["chart"] is None
    assert report["checkpoints"][0]["episodes"] == 2
    assert not (out / "evaluation.png").exists()
    assert f"wrote {out / 'evaluation.json'}" in caplog.messages
