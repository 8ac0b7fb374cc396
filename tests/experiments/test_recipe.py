"""The CPU recipe: its stages (one run per arm keeps every curve checkpoint; every evaluation decodes alike), the stage runner
(order, parallel jobs, skipping, failures), the statistics, and (slow) the whole recipe end to end at tiny sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from common.config_schema import ConfigError, parse_config
from experiments.estimates import interval, paired_difference, slope, t_critical
from experiments.recipe.config import Arm, RecipeConfig
from experiments.recipe.recipe import curve_report, curve_steps, recipe_stages
from opd.episodes.scoring import mean_and_se
from tests.helpers.configs import compose_config
from tests.helpers.paths import REPO_ROOT

TINY = ["data.train=40", "data.distill=16", "data.heldout=10", "teacher.sft_steps=3", "student.sft_steps=2",
        "distill.steps=3", "distill.eval_every=2", "distill.batch_size=2", "teacher.hidden_size=64",
        "teacher.num_hidden_layers=2", "student.hidden_size=64", "student.num_hidden_layers=2",
        "distill.max_gen_len=8", "evaluation.max_gen_len=8", "evaluation.batch_size=5"]


def recipe_config(tmp_path, *overrides) -> RecipeConfig:
    """The recipe's settings as ``python -m experiments.recipe.recipe`` parses them."""
    return parse_config(RecipeConfig, compose_config("recipe", [f"out_dir={tmp_path}", "tokenizer=TOK", *overrides]))


def argument(command: list[str], key: str) -> str | None:
    return next((part.split("=", 1)[1] for part in command if part.startswith(f"{key}=")), None)


def test_curve_steps_end_at_the_last_step(tmp_path):
    assert curve_steps(recipe_config(tmp_path, "distill.steps=200", "distill.eval_every=40")) == [40, 80, 120, 160, 200]
    assert curve_steps(recipe_config(tmp_path, "distill.steps=100", "distill.eval_every=40")) == [40, 80, 100]
    with pytest.raises(ConfigError, match="distill.eval_every must be an integer >= 1, got 0"):
        recipe_config(tmp_path, "distill.eval_every=0")


def test_every_arm_is_one_run_keeping_its_curve_checkpoints_on_one_schedule(tmp_path):
    cfg = recipe_config(tmp_path, "seeds=[0,1]", "distill.steps=100", "distill.eval_every=40")
    stages = {stage.name: stage for stage in recipe_stages(cfg)}
    for seed in (0, 1):
        for arm, spec in cfg.arms.items():
            run = stages[f"seed{seed}-{arm}"]
            stem = "agent_opd_128" if spec.entry == "opd" else "continued_sft_128"
            assert run.outputs == [tmp_path / f"seed{seed}" / arm / f"{stem}_step{step}.pth" for step in (40, 80, 100)]
            assert {key: argument(run.command, key) for key in ("max_steps", "save_interval", "keep_saved_weights",
                                                                "resume")} == {
                "max_steps": "100", "save_interval": "40", "keep_saved_weights": "true", "resume": None}
            assert run.needs == (f"seed{seed}-student", *(["teacher"] if spec.entry == "opd" else []))
            assert [entry for entry in run.command if entry.endswith(".py")] == [
                "opd/train.py" if spec.entry == "opd" else "opd/sft.py"]
            # every arm starts from the seed's student with the same batch and schedule
            assert str(tmp_path / f"seed{seed}" / "student") in " ".join(run.command)
            shared = ("batch_size", "optim.learning_rate", "optim.warmup_steps", "optim.lr_scheduler", "seed")
            assert {key: argument(run.command, key) for key in shared} == {
                "batch_size": "8", "optim.learning_rate": str(cfg.distill.learning_rate),
                "optim.warmup_steps": str(cfg.distill.warmup_steps), "optim.lr_scheduler": "cosine", "seed": str(seed)}
            evaluation = stages[f"seed{seed}-{arm}-eval"]
            assert evaluation.needs == (run.name,) and all(str(path) in argument(evaluation.command, "models")
                                                          for path in run.outputs)
    assert argument(stages["seed0-opd_forward_kl"].command, "data").endswith("distill_prompts.jsonl")
    assert argument(stages["seed0-continued_sft"].command, "data").endswith("train_demonstrations.jsonl")


def test_every_evaluation_decodes_with_the_same_settings(tmp_path):
    cfg = recipe_config(tmp_path, "seeds=[0,1]")
    evaluations = [stage for stage in recipe_stages(cfg) if stage.name.endswith("eval")]
    assert len(evaluations) == 1 + 2 * (1 + len(cfg.arms))

    def decoding(stage):
        return [part for part in stage.command if not part.startswith(("models=", "out_dir=", "hydra.run.dir="))]

    assert all(decoding(stage) == decoding(evaluations[0]) for stage in evaluations)
    assert {"sampling=greedy", "isolate=false", f"seed={cfg.evaluation.seed}"} <= set(decoding(evaluations[0]))


def test_a_bad_arm_or_baseline_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="baseline_arm must be one of the arms .*, got 'nope'"):
        recipe_config(tmp_path, "baseline_arm=nope")
    with pytest.raises(ConfigError, match="arms.continued_sft.entry must be one of opd, sft, got 'rl'"):
        recipe_config(tmp_path, "arms.continued_sft.entry=rl")


@pytest.mark.parametrize("overrides,message", [
    (["tokenizer=null"], "tokenizer is not set: pass tokenizer=PATH or export MINIMIND_TOKENIZER"),
    (["seeds=[0,0]"], "seeds must be a non-empty list of distinct integers, got [0, 0]"),
    (["seeds=[]"], "seeds must be a non-empty list of distinct integers, got []"),
    (["jobs=0"], "jobs must be an integer >= 1, got 0"),
    (["data.heldout=0"], "data.heldout must be an integer >= 1, got 0"),
    (["teacher.sft_steps=0"], "teacher.sft_steps must be an integer >= 1, got 0"),
    (["student.learning_rate=-1"], "student.learning_rate must be a positive number, got -1.0"),
    (["distill.lr_scheduler=step"], "distill.lr_scheduler must be one of constant, linear, cosine, got 'step'"),
    (["sft.warmup_steps=-1"], "sft.warmup_steps must be an integer >= 0, got -1"),
    (["evaluation.max_gen_len=0"], "evaluation.max_gen_len must be an integer >= 1, got 0"),
    (["arms.continued_sft.data=everything"], "arms.continued_sft.data must be one of train_demonstrations, "
                                             "distill_prompts, heldout_prompts, got 'everything'"),
    (["+arms.x={entry: opd, data: distill_prompts}"], "arms.x.overrides"),
    (["+arms.x={entry: opd, data: distill_prompts, overrides: [], learning_rate: 0}"],
     "arms.x.learning_rate must be a positive number, got 0.0"),
    (["distill.steps=many"], "distill.steps must be an integer, got 'many'"),
    (["+distill.momentum=0.9"], "unknown setting distill.momentum"),
])
def test_each_bad_setting_stops_the_recipe_at_start_naming_its_key(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as caught:
        recipe_config(tmp_path, *overrides)
    assert message in str(caught.value)


def test_an_arm_may_set_its_own_learning_rate(tmp_path):
    cfg = recipe_config(tmp_path, "+arms.fast={entry: opd, data: distill_prompts, overrides: [], learning_rate: 3e-3}")
    assert isinstance(cfg.arms["fast"], Arm) and cfg.arms["opd_forward_kl"].learning_rate is None
    stages = {stage.name: stage for stage in recipe_stages(cfg)}
    assert argument(stages["seed0-fast"].command, "optim.learning_rate") == "0.003"
    assert argument(stages["seed0-opd_forward_kl"].command, "optim.learning_rate") == str(cfg.distill.learning_rate)


def test_mean_and_standard_error():
    assert mean_and_se([0.5]) == (0.5, None)
    mean, se = mean_and_se([0.2, 0.4, 0.6])
    assert mean == pytest.approx(0.4) and se == pytest.approx(0.2 / 3**0.5)


def test_paired_difference_is_per_problem_and_per_seed():
    arm = [{"p1": True, "p2": True, "p3": False, "p4": True}, {"p1": True, "p2": False, "p3": False, "p4": True}]
    baseline = [{"p1": False, "p2": True, "p3": False, "p4": False}, {"p1": True, "p2": False, "p3": True, "p4": False}]
    result = paired_difference(arm, baseline)
    per_problem = [0.5, 0.0, -0.5, 1.0]  # averaged over the two seeds
    assert result["mean"] == pytest.approx(sum(per_problem) / 4) and result["problems"] == 4
    assert result["se_problems"] == pytest.approx(mean_and_se(per_problem)[1])
    assert result["per_seed"] == pytest.approx([0.5, 0.0]) and result["se_seeds"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="same held-out problems"):
        paired_difference(arm, [{"p1": True}, {"p1": True}])


@pytest.mark.parametrize(("df", "expected"), [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (1000, 1.962)])
def test_t_critical_values_match_the_published_table(df, expected):
    assert t_critical(df) == pytest.approx(expected, abs=1e-3)
    assert t_critical(df, level=0.5) < t_critical(df)


def test_an_interval_over_seeds_is_t_with_n_minus_1_degrees_of_freedom_and_a_slope_is_least_squares():
    low, high = interval(0.04, 0.01, 3)  # 3 seeds: 2 df, 4.303
    assert (low, high) == pytest.approx((0.04 - 0.04303, 0.04 + 0.04303), abs=1e-5)
    assert interval(0.04, None, 1) is None
    # differences 0.04, 0.06, 0.11, 0.13 at H = 1, 2, 4, 6: x mean 3.25, sum dx*dy 0.275, sum dx^2 14.75
    assert slope([1, 2, 4, 6], [0.04, 0.06, 0.11, 0.13]) == pytest.approx(0.275 / 14.75)
    assert slope([1, 2, 4], [0.3, 0.3, 0.3]) == 0.0


@pytest.mark.slow
def test_recipe_runs_every_stage_then_skips_them(tmp_path, tokenizer_path):
    command = [sys.executable, "-m", "experiments.recipe.recipe", f"tokenizer={tokenizer_path}", f"out_dir={tmp_path}", *TINY]
    first = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:] + first.stdout[-3000:]
    summary = json.loads((tmp_path / "recipe_summary.json").read_text())
    report = summary["report"]
    arms = ["opd_forward_kl", "opd_reverse_kl", "kd_teacher_rollouts", "continued_sft"]
    assert list(report["curves"]) == arms and report["steps"] == [2, 3]
    for points in report["curves"].values():
        assert [point["step"] for point in points] == [0, 2, 3]
        assert points[0]["accuracy"] == report["student"]["accuracy"]  # every curve starts at the student
        assert 0 < points[1]["wall_s"] < points[2]["wall_s"]
    assert set(report["paired_vs_baseline"]) == set(arms) - {"kd_teacher_rollouts"}
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and summary["reused_stages"] == []
    assert len(list((tmp_path / "seed0" / "teacher_rollouts").glob("*.jsonl"))) == 1
    again = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    reused = json.loads((tmp_path / "recipe_summary.json").read_text())
    assert reused["reused_stages"] == list(summary["stage_wall_s"])
    # every stage reused: its cost from nothing is still the first run's stage times replayed
    assert reused["wall_s_from_nothing"] == summary["wall_s_from_nothing"] >= max(summary["stage_wall_s"].values())
    changed = subprocess.run([*command, "student.sft_steps=3"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=900)
    assert changed.returncode == 0, changed.stderr[-3000:]
    # the student reran, so everything reading its weights reran too
    assert json.loads((tmp_path / "recipe_summary.json").read_text())["reused_stages"] == ["data", "teacher",
                                                                                         "teacher-eval"]


def fake_evaluation(directory: Path, checkpoints: dict[str, list[bool]], settings: dict | None = None) -> None:
    """An evaluation folder as opd/evaluate.py writes it: evaluation.json and each checkpoint's episodes."""
    directory.mkdir(parents=True)
    entries = []
    for name, correct in checkpoints.items():
        rows = [{"source": f"heldout.jsonl:{i + 1}", "correct": flag} for i, flag in enumerate(correct)]
        (directory / f"episodes_{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        entries.append({"name": name, "episodes": len(correct), "accuracy": sum(correct) / len(correct),
                        "tool_success_rate": 1.0, "tool_error_rate": 0.0, "recovery_rate": None,
                        "truncation_rate": 0.0, "mean_turns": 2.0})
    (directory / "evaluation.json").write_text(json.dumps({
        "data_sha256": "abc", "records": len(next(iter(checkpoints.values()))),
        "settings": settings or {"sampling": {"temperature": 0.0}, "seed": 0}, "checkpoints": entries}))


def test_the_report_pairs_every_arm_with_the_baseline_problem_by_problem(tmp_path):
    cfg = recipe_config(tmp_path, "seeds=[0,1]", "distill.steps=4", "distill.eval_every=2")
    cfg.arms = {name: Arm("opd", "distill_prompts", []) for name in ("opd", "kd")}
    cfg.baseline_arm = "kd"
    fake_evaluation(tmp_path / "eval" / "teacher", {"teacher": [True, True, True, False]})
    for seed in (0, 1):
        fake_evaluation(tmp_path / f"seed{seed}" / "eval" / "student", {"student": [False, False, True, False]})
        fake_evaluation(tmp_path / f"seed{seed}" / "eval" / "opd",
                        {"step2": [True, False, True, False], "step4": [True, True, True, seed == 1]})
        fake_evaluation(tmp_path / f"seed{seed}" / "eval" / "kd",
                        {"step2": [False, False, True, False], "step4": [True, False, True, False]})
        for arm in ("opd", "kd"):  # a run's metrics, its step 2 logged twice (a rerun appends): the last counts
            rows = [(1, 1.0), (2, 99.0), (1, 4.0), (2, 10.0 + seed), (3, 15.0), (4, 20.0 + 2 * seed)]
            (tmp_path / f"seed{seed}" / arm / "run").mkdir(parents=True)
            (tmp_path / f"seed{seed}" / arm / "run" / "metrics.jsonl").write_text(
                "".join(json.dumps({"step": step, "elapsed_s": elapsed}) + "\n" for step, elapsed in rows))
    report = curve_report(cfg)
    assert [p["accuracy"] for p in report["curves"]["opd"]] == [0.25, 0.5, 0.875]
    assert [p["wall_s"] for p in report["curves"]["opd"]] == [0.0, 10.5, 21.0]  # seconds of training, mean over seeds
    assert report["curves"]["opd"][2]["se_seeds"] == pytest.approx(0.125)
    final = report["paired_vs_baseline"]["opd"][-1]
    assert final["step"] == 4 and final["mean"] == pytest.approx((0 + 1 + 0 + 0.5) / 4)
    assert final["per_seed"] == pytest.approx([0.25, 0.5])
    assert report["final"]["opd"]["gap_closed"] == pytest.approx((0.875 - 0.25) / (0.75 - 0.25))
    metrics = tmp_path / "seed1" / "opd" / "run" / "metrics.jsonl"
    complete = metrics.read_text()
    metrics.write_text("".join(complete.splitlines(keepends=True)[:-1]))  # a run that never reached step 4
    with pytest.raises(RuntimeError, match=r"seed1/opd/run/metrics.jsonl has no metrics for steps \[4\]"):
        curve_report(cfg)
    metrics.write_text(complete)
    # evaluations that did not decode alike are never compared
    (tmp_path / "seed1" / "eval" / "kd" / "evaluation.json").unlink()
    fake_evaluation(tmp_path / "seed1" / "eval" / "kd2", {"step2": [True] * 4, "step4": [True] * 4},
                    settings={"sampling": {"temperature": 1.0}, "seed": 0})
    (tmp_path / "seed1" / "eval" / "kd2" / "evaluation.json").rename(tmp_path / "seed1" / "eval" / "kd" / "evaluation.json")
    with pytest.raises(RuntimeError, match="differ in decoding settings or held-out data"):
        curve_report(cfg)


def test_read_evaluation_averages_a_prompts_samples(tmp_path):
    """With samples_per_prompt > 1 each source has several rows: its correctness is their mean, not the last one's."""
    from experiments.estimates import read_evaluation

    (tmp_path / "evaluation.json").write_text(json.dumps({"checkpoints": [{"name": "m"}]}))
    rows = [("a:1", True), ("a:1", False), ("a:1", False), ("a:1", True), ("a:2", False), ("a:2", False)]
    (tmp_path / "episodes_m.jsonl").write_text("".join(json.dumps({"source": s, "correct": c}) + "\n" for s, c in rows))
    assert read_evaluation(tmp_path)["checkpoints"][0]["correct"] == {"a:1": 0.5, "a:2": 0.0}
