"""The study: its settings, its stages (one schedule for every arm, the right teacher, identical evaluations), and
its report (per-horizon accuracy, paired differences, recovery) against hand calculations on written evaluations."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from dataclasses import asdict
from types import SimpleNamespace

import pytest
from rich.console import Console

from common.config_schema import ConfigError, parse_config
from experiments.charts import write_study_charts
from experiments.stages import replay
from experiments.study.config import GATES, StudyConfig
from experiments.study.curve_problems import main as curve_main
from experiments.study.gates import intermediate_calls
from experiments.study.report import checkpoint_scores, print_report, reading, study_report, summary_results
from experiments.study.study import PILOT_TIMES, StudyPaths, curve_steps, study_stages, with_estimates
from opd.episodes.scoring import EpisodeScore
from tests.helpers.configs import compose_config
from tests.helpers.entries import run_main
from tests.helpers.paths import REPO_ROOT


def study_config(tmp_path, *overrides) -> StudyConfig:
    """The study's settings as ``python -m experiments.study.study`` parses them."""
    return parse_config(StudyConfig, compose_config("study", [f"out_dir={tmp_path}", "tokenizer=TOK", *overrides]))


# an on-policy arm named opd, for the tests written before the fourth full run's arms
OPD_ARM = ("+arm_settings.opd={entry: opd, teacher: robust, data: distill_prompts, on_policy: true, "
           "overrides: ['mode=on_policy']}")


def argument(command: list[str], key: str) -> str | None:
    return next((part.split("=", 1)[1] for part in command if part.startswith(f"{key}=")), None)


def test_every_arm_continues_the_seeds_warm_student_on_one_schedule_with_its_own_teacher(tmp_path):
    cfg = study_config(tmp_path, "seeds=[0,1]", "distill.steps=100", "distill.eval_every=40", "data.match_noise=true")
    stages = {stage.name: stage for stage in study_stages(cfg)}
    paths = StudyPaths(cfg)
    assert curve_steps(cfg) == [40, 80, 100]
    curve_data = stages["curve-data"]
    assert curve_data.needs == ("data",) and curve_data.outputs == [paths.curve_prompts()]
    assert curve_data.command[curve_data.command.index("--horizon") + 1] == "6"  # the endpoint's horizon by default
    for seed in (0, 1):
        # the warm student is step 0 of every arm's curve: on the curve's problems, under the curve's decoding
        warm = stages[f"seed{seed}-student-curve"]
        assert warm.needs == (f"seed{seed}-student", "curve-data")
        assert argument(warm.command, "data") == str(paths.curve_prompts())
        assert argument(warm.command, "sampling") == "opd_rollout" and argument(warm.command, "samples_per_prompt") == "4"
        for arm, spec in cfg.arm_settings.items():
            # one stage per arm and seed: the run, then its curve, evaluations and probes, then its weights kept
            whole = stages[f"seed{seed}-{arm}"]
            run = SimpleNamespace(command=next(c for c in whole.commands if c[1] == "opd/train.py"),
                                  needs=whole.needs)
            evaluations = [c for c in whole.commands if c[1:2] == ["opd/evaluate.py"]]
            curve, finals = evaluations[0], evaluations[1:]
            assert [argument(curve, key) for key in ("data", "sampling")] == [str(paths.curve_prompts()), "opd_rollout"]
            assert all(f"step{step}: " in argument(curve, "models") for step in (40, 80, 100))
            assert [argument(c, "sampling") for c in finals] == ["opd_rollout", "greedy"]
            for final in finals:  # the last checkpoint alone on every problem under every decoding
                models = argument(final, "models")
                assert "step100: " in models and "step40" not in models and "step80" not in models
                assert argument(final, "data") == str(paths.file("heldout_prompts"))
            assert whole.commands[-1] == [sys.executable, "-m", "experiments.weights",
                                          str(paths.arm_checkpoint(seed, arm, 100)), str(paths.arm_final(seed, arm))]
            assert whole.commands.index(finals[-1]) < len(whole.commands) - 1
            recovery = next(c for c in whole.commands if c[2:3] == ["experiments.study.continuation"])
            assert recovery[recovery.index("--model") + 1] == str(paths.arm_checkpoint(seed, arm, 100))
            assert recovery[recovery.index("--episodes") + 1] == str(
                paths.evaluation(seed, "student", "t1") / "episodes_student.jsonl.gz")
            entropy = next(c for c in whole.commands if c[2:3] == ["experiments.study.divergence"])
            assert entropy[entropy.index("--data") + 1] == str(paths.file("heldout_prompts"))
            assert whole.outputs[0] == paths.arm_metrics(seed, arm) and paths.arm_final(seed, arm) in whole.outputs
            assert {paths.curve(seed, arm) / "evaluation.json", paths.arm(seed, arm) / "recovery.json",
                    paths.arm(seed, arm) / "divergence.json",
                    *(paths.curve(seed, arm) / f"episodes_step{step}.jsonl.gz" for step in (40, 80, 100)),
                    *(paths.evaluation(seed, arm, d) / "episodes_step100.jsonl.gz" for d in ("t1", "greedy"))
                    } <= set(whole.outputs)
            # the KD arms train on the same teacher rollouts: the seed's first keeps them, the other restores them
            if arm == "kd":
                assert paths.teacher_rollouts(seed) in whole.outputs and "keep" in whole.commands[1]
            if arm == "kd_rkl":
                assert f"seed{seed}-kd" in whole.needs
                assert whole.commands[0][3:5] == ["restore", f"--kept={paths.teacher_rollouts(seed)}"]
                assert whole.commands[2][3:5] == ["check", f"--kept={paths.teacher_rollouts(seed)}"]
            elif arm != "kd":
                assert f"seed{seed}-kd" not in whole.needs
            shared = ("batch_size", "optim.learning_rate", "optim.warmup_steps", "optim.lr_scheduler", "seed",
                      "max_steps", "save_interval", "keep_saved_weights")
            assert {key: argument(run.command, key) for key in shared} == {
                "batch_size": "8", "optim.learning_rate": str(cfg.distill.learning_rate),
                "optim.warmup_steps": str(cfg.distill.warmup_steps), "optim.lr_scheduler": "cosine",
                "seed": str(seed), "max_steps": "100", "save_interval": "40", "keep_saved_weights": "true"}
            start = argument(run.command, "model.checkpoint" if spec.entry == "sft" else "student.checkpoint")
            assert start == str(paths.student(seed))
            if spec.entry == "opd":
                assert argument(run.command, "teacher.checkpoint") == str(paths.teacher(spec.teacher))
                noisy = ("noisy-data",) if spec.data == "distill_noisy_demonstrations" else ()
                reads = (f"seed{seed}-student", f"seed{seed}-student-eval-t1", "curve-data", f"teacher-{spec.teacher}")
                assert run.needs == (*reads, *noisy, *([f"seed{seed}-kd"] if arm == "kd_rkl" else []))
                assert all(override in run.command for override in spec.overrides)
            assert argument(run.command, "data") == str(paths.file(spec.data))
            noisy_data = spec.data == "distill_noisy_demonstrations"  # a few are longer than a rollout may grow
            assert argument(run.command, "offline.drop_too_long") == ("true" if noisy_data else None)
    assert {spec.teacher for spec in cfg.arm_settings.values()} == {"robust"}
    assert set(cfg.arm_settings) == {"kd", "kd_dart", "opd_rkl", "opd_fkl_masked", "kd_rkl"}
    assert cfg.endpoint.arm == "opd_rkl" and "loss.mask_broken_turns=true" in cfg.arm_settings["opd_fkl_masked"].overrides
    robust = stages["teacher-robust"]
    assert argument(robust.command, "data") == str(paths.file("train_noisy_demonstrations"))
    # the gold teacher: its SFT, run by the pick, which stops it at the first kept checkpoint past the threshold
    pick = stages["teacher-gold"].command
    gold = SimpleNamespace(command=pick[pick.index("--") + 1:])
    assert gold.command[:2] == [sys.executable, "opd/sft.py"]
    assert argument(gold.command, "data") == str(paths.file("train_demonstrations"))
    assert argument(gold.command, "save_interval") == str(cfg.teacher_pick.check_every)
    assert pick[pick.index("--min-accuracy") + 1] == str(cfg.teacher_pick.min_accuracy) == "0.95"
    assert pick[pick.index("--run-dir") + 1] == str(paths.teacher_run("gold_sft").parent)
    assert argument(gold.command, "out_dir") == str(paths.teacher_run("gold_sft").parent)
    # what later stages read is kept in the run folder (weights as safetensors, the pick's report beside them); the
    # SFT runs are scratch
    assert stages["teacher-gold"].outputs == [paths.teacher("gold"), paths.out / "teachers" / "teacher_gold_128.json"]
    assert stages["teacher-gold"].needs == ("data",) and paths.teacher("gold").suffix == ".safetensors"
    assert paths.teacher_run("gold_sft").is_relative_to(paths.scratch)
    assert stages["seed1-student"].outputs == [paths.out / "seed1" / "student_warm_64.safetensors",
                                               paths.out / "seed1" / "student_warm_64.json"]
    assert [stages[name].then for name in ("teacher-robust-sft", "teacher-robust")] == [
        ([sys.executable, "-m", "experiments.weights", str(paths.teacher_run(kind)), str(paths.teacher(kind))],)
        for kind in ("robust_sft", "robust")]
    assert all(stages[name].rebuilt for name in ("data", "curve-data", "noisy-data"))
    assert not any(stage.rebuilt for name, stage in stages.items() if "data" not in name)
    student = stages["seed1-student"].command
    # the warm start: half of its demonstrations noise-injected, written by the data stage at data's noise settings
    assert argument(student[student.index("--") + 1:], "data") == str(paths.file("warm_noisy_demonstrations"))
    assert paths.file("warm_noisy_demonstrations") in stages["data"].outputs
    task = stages["data"].command
    assert task[task.index("--warm-noisy-share") + 1] == "0.5" and task[task.index("--value-noise") + 1] == "0.229"
    assert stages["seed1-student"].needs == ("data",)
    gold_start = {stage.name: stage for stage in study_stages(study_config(tmp_path, "warm.noisy_share=0"))}
    plain = gold_start["seed1-student"].command
    assert argument(plain[plain.index("--") + 1:], "data") == str(paths.file("warm_demonstrations"))
    assert "--warm-noisy-share" not in gold_start["data"].command and "--value-noise" not in gold_start["data"].command
    # a seed short of the warm threshold by the cap starts from its best checkpoint; a teacher short of it stops the run
    assert "--best-if-none" in student[:student.index("--")] and "--best-if-none" not in pick
    # the robust teacher continues the gold one: the same architecture and schedule, its own steps and data; then
    # the anneal continues it at the lower lr, and writes the robust teacher every other stage reads
    robust_sft = stages["teacher-robust-sft"]
    assert robust_sft.needs == ("teacher-gold", "noisy-data") and robust_sft.outputs == [paths.robust_sft()]
    assert argument(robust_sft.command, "model.checkpoint") == str(paths.teacher("gold"))
    assert argument(robust_sft.command, "data") == str(paths.file("train_noisy_demonstrations"))
    assert robust.needs == ("teacher-robust-sft",) and robust.outputs == [paths.teacher("robust")]
    assert argument(robust.command, "model.checkpoint") == str(paths.robust_sft())
    # they take every core (an SFT writes the same weights under any thread count); what generates does not
    assert [name for name, stage in stages.items() if stage.wide] == ["teacher-robust-sft", "teacher-robust"]
    # the noise rates reach the noisy files' stage only, by default from the noise-match stage's file
    noisy = stages["noisy-data"].command
    assert noisy[noisy.index("--noise-rates") + 1] == str(paths.noise_rates()) and "--noise-rates" not in stages["data"].command
    fixed = {stage.name: stage for stage in study_stages(study_config(tmp_path, "data.match_noise=false"))}
    noisy = fixed["noisy-data"].command  # set by hand: setting them from the pilot reruns nothing else
    assert noisy[noisy.index("--value-noise") + 1] == str(cfg.data.value_noise)
    assert "from_scratch=true" in gold.command and "from_scratch=true" not in robust_sft.command
    assert argument(robust_sft.command, "max_steps") == str(cfg.sft.robust_teacher_steps) == "900"
    assert argument(robust.command, "max_steps") == str(cfg.sft.robust_anneal_steps) == "1200"
    assert argument(robust_sft.command, "optim.learning_rate") == str(cfg.teacher.learning_rate)
    assert argument(robust.command, "optim.learning_rate") == str(cfg.sft.robust_anneal_learning_rate) == "0.001"
    # retries make a few noisy demonstrations longer than a rollout may grow: those SFTs leave them out
    assert argument(robust_sft.command, "drop_too_long") == argument(robust.command, "drop_too_long") == "true"
    assert argument(gold.command, "drop_too_long") is None and argument(student, "drop_too_long") == "true"
    assert argument(robust.command, "max_total_len") == str(cfg.distill.max_total_len)
    varying = ("data=", "save_prefix=", "out_dir=", "hydra.run.dir=", "from_scratch=", "model.checkpoint=",
               "max_steps=", "epochs=", "save_interval=", "keep_saved_weights=", "optim.learning_rate=",
               "drop_too_long=")
    assert [p for p in robust_sft.command if not p.startswith(varying)] == [
        p for p in gold.command if not p.startswith(varying)] == [
        p for p in robust.command if not p.startswith(varying)]
    # without the anneal, the first continuation is the robust teacher
    plain = {stage.name: stage for stage in study_stages(study_config(tmp_path, "sft.robust_anneal_steps=0"))}
    assert "teacher-robust-sft" not in plain and [name for name, stage in plain.items() if stage.wide] == ["teacher-robust"]
    assert plain["teacher-robust"].needs == ("teacher-gold", "noisy-data")
    assert argument(plain["teacher-robust"].command, "model.checkpoint") == str(paths.teacher("gold"))
    assert argument(plain["teacher-robust"].command, "max_steps") == "900"
    assert argument(plain["teacher-robust"].command, "optim.learning_rate") == str(cfg.teacher.learning_rate)


def test_every_evaluation_decodes_the_same_held_out_problems_with_the_same_settings_per_decoding(tmp_path):
    """Each checkpoint is evaluated under both decodings: T=1 with 4 samples per problem (the rollouts' decoding)
    and greedy (the negative control); within a decoding every evaluation has the same command but its models."""
    cfg = study_config(tmp_path, "seeds=[0,1]")
    stages = study_stages(cfg)
    for decoding, sampling, samples in (("t1", "opd_rollout", "4"), ("greedy", "greedy", "1")):
        alone = [stage.command for stage in stages if stage.name.endswith(f"eval-{decoding}")]
        assert len(alone) == 1 + 2  # the teacher; per seed the student; each arm evaluates in its own stage
        held_out = f"data={StudyPaths(cfg).file('heldout_prompts')}"
        in_arms = [command for stage in stages if stage.name.split("-", 1)[-1] in cfg.arm_settings
                   for command in stage.commands if held_out in command and f"sampling={sampling}" in command]
        evaluations = alone + in_arms
        assert len(in_arms) == 2 * len(cfg.arm_settings)

        def settings(command):
            return [part for part in command if not part.startswith(("models=", "out_dir=", "hydra.run.dir="))]

        assert all(settings(command) == settings(evaluations[0]) for command in evaluations)
        assert argument(evaluations[0], "sampling") == sampling
        assert argument(evaluations[0], "samples_per_prompt") == samples
        assert argument(evaluations[0], "data") == str(StudyPaths(cfg).file("heldout_prompts"))
        assert all(argument(command, "rollout.max_turns") == "14" for command in evaluations)
    continuation = next(stage for stage in stages if stage.name == "seed1-continuation")
    assert continuation.needs == ("seed1-student-eval-t1", "teacher-robust")
    assert continuation.outputs == [StudyPaths(cfg).continuation(1),
                                    StudyPaths(cfg).continuation_episodes(1).with_suffix(".jsonl.gz")]
    assert continuation.then == ([sys.executable, "-m", "gzip", "--best",
                                  str(StudyPaths(cfg).continuation_episodes(1))],)
    flag = continuation.command.index("--episodes-out")
    assert continuation.command[flag + 1] == str(StudyPaths(cfg).continuation_episodes(1))


def test_the_primary_arms_run_on_every_seed_and_the_secondary_ones_on_their_own(tmp_path):
    """The fourth run's amendment: kd, kd_rkl and opd_rkl on seeds 0-4, opd_fkl_masked and kd_dart on 0-2."""
    cfg = study_config(tmp_path)
    names = {stage.name for stage in study_stages(cfg)}
    assert cfg.seeds == [0, 1, 2, 3, 4]
    runs = {arm: [seed for seed in cfg.seeds if f"seed{seed}-{arm}" in names] for arm in cfg.arm_settings}
    assert runs == {"kd": [0, 1, 2, 3, 4], "kd_rkl": [0, 1, 2, 3, 4], "opd_rkl": [0, 1, 2, 3, 4],
                    "opd_fkl_masked": [0, 1, 2], "kd_dart": [0, 1, 2]}
    assert {seed for seed in cfg.seeds if f"seed{seed}-student" in names} == set(cfg.seeds)
    assert "seed3-kd_dart" not in names and "seed3-student-eval-t1" in names
    with pytest.raises(ConfigError, match=r"arm_settings.kd.seeds must be null: the baseline runs on every seed"):
        study_config(tmp_path, "+arm_settings.kd.seeds=[0]")


def test_a_slice_runs_the_chosen_arms_and_the_baseline_for_the_chosen_seeds(tmp_path):
    cfg = study_config(tmp_path, "seeds=[2]", "arms=[opd_rkl]", "horizons=[4]", "warm.horizons=[4]",
                       "endpoint.horizon=4")
    names = {stage.name for stage in study_stages(cfg)}
    assert not any(name.startswith("seed0") for name in names)
    assert {name for name in names if name.startswith("seed2-") and "-eval-" not in name} == {
        "seed2-kd", "seed2-opd_rkl", "seed2-student", "seed2-divergence", "seed2-continuation",
        "seed2-student-continuation", "seed2-student-curve"}
    data = next(stage for stage in study_stages(cfg) if stage.name == "data")
    assert data.command[data.command.index("--horizons") + 1] == "4"


def test_the_students_start_before_the_gold_teacher_so_a_student_at_its_cap_ends_first(tmp_path):
    """The third full run: seed 1's student ran to its cap (3,089 s), the gold teacher took 1,366 s, and the robust
    teacher waits for both. Listed first, the students start first, and the slow one ends 3,089 s in, not 1,366 s
    later."""
    stages = study_stages(study_config(tmp_path))
    names = [stage.name for stage in stages]
    assert max(names.index(f"seed{seed}-student") for seed in (0, 1, 2)) < names.index("teacher-gold")
    wall = {"data": 1.0, "teacher-gold": 1366.0, "seed0-student": 839.0, "seed1-student": 3089.0,
            "seed2-student": 703.0}
    before_robust = [stage for stage in stages if stage.name in wall]  # in listed order
    assert replay(before_robust, wall, jobs=2) == 1.0 + 3089.0
    gold_first = sorted(before_robust, key=lambda stage: stage.name != "teacher-gold")
    assert replay(gold_first, wall, jobs=2) == 1.0 + 839.0 + 3089.0


def test_a_checked_task_reaches_both_data_stages():
    for checked, operand in ((False, False), (True, False), (True, True)):
        cfg = study_config("/tmp/unused", f"data.checked={str(checked).lower()}",
                           f"data.checked_operand={str(operand).lower()}", *([] if checked else ["data.guard_share=0"]),
                           *([] if operand else ["data.guard_numbers={a: 1, b: 0, c: 0, m: 0}"]))
        found = [stage for stage in study_stages(cfg) if stage.name in ("data", "noisy-data")]
        assert len(found) == 2
        for stage in found:
            assert ("--checked" in stage.command) == checked
            assert ("--checked-operand" in stage.command) == operand


def test_the_noisy_data_stage_passes_the_guard_numbers():
    cfg = study_config("/tmp/unused", "data.match_noise=false", "data.guard_numbers={a: 0.25, b: 0, c: 0.75, m: 0}")
    stages = {stage.name: stage for stage in study_stages(cfg)}
    for name in ("noisy-data", "data"):  # the data stage's for the warm start, whose noise is set by hand
        command = stages[name].command
        assert command[command.index("--guard-numbers") + 1] == "a=0.25,b=0,c=0.75,m=0"


def test_only_the_noisy_data_stage_names_the_retry_input():
    """retry_names_input changes the noisy files alone, so the gold data's stage (and every stage reading it, the
    teachers' and students' SFT) keeps its command and is reused; unless the warm start holds noise too."""
    for named in (False, True):
        stages = {stage.name: stage for stage in study_stages(study_config(
            "/tmp/unused", f"data.retry_names_input={str(named).lower()}", "warm.noisy_share=0"))}
        data, noisy = stages["data"], stages["noisy-data"]
        assert "--retry-names-input" not in data.command
        assert ("--retry-names-input" in noisy.command) == named


@pytest.mark.parametrize("overrides,message", [
    (["arms=[nope]"], "arms must be a list of arm names among kd, kd_dart"),
    (["horizons=[1,9]"], "horizons must be a non-empty list of distinct horizons among [1, 2, 3, 4, 5, 6]"),
    (["distill.max_turns=13"], "distill.max_turns must be at least 2 * max(horizons) + 2 = 14"),
    (["evaluation.max_turns=5", "horizons=[1,2]", "warm.horizons=[1,2]", "endpoint.horizon=2"],
     "evaluation.max_turns must be at least 2 * max(horizons) + 2 = 6"),
    (["baseline_arm=best"], "baseline_arm must be one of the arms"),
    (["arm_settings.kd.teacher=none"], "arm_settings.kd.teacher must be none for an sft arm and gold or robust"),
    (["data.value_noise=1.0"], "data.value_noise must be in [0, 1), got 1.0"),
    (["data.checked_operand=false", "data.guard_numbers.c=1"],
     "data.guard_numbers must be without c and m unless data.checked_operand is true"),
    (["data.guard_numbers={a: 0, b: 0, c: 0, m: 0}"], "data.guard_numbers must be a mapping of some of a, b, c, m to weights >= 0, not all 0"),
    (["data.guard_numbers.b=-1"], "data.guard_numbers must be a mapping of some of a, b, c, m to weights >= 0"),
    (["data.value_noise=0.6", "data.syntax_noise=0.5"], "data.syntax_noise must be below 1 - data.value_noise = 0.4"),
    (["data.operand_share=1.5"], "data.operand_share must be in [0, 1], got 1.5"),
    (["data.guard_share=-0.1"], "data.guard_share must be in [0, 1], got -0.1"),
    (["data.checked=false", "data.guard_share=0.3"], "data.guard_share must be 0 unless data.checked is true"),
    (["data.checked=maybe"], "data.checked must be true or false, got 'maybe'"),
    (["data.checked=false", "data.guard_share=0", "data.checked_operand=true"],
     "data.checked_operand must be false unless data.checked is true"),
    (["endpoint.arm=kd"], "endpoint.arm must be an arm other than the baseline (kd)"),
    (["endpoint.horizon=3"], "endpoint.horizon must be one of [1, 2, 4, 6]"),
    (["endpoint.decoding=beam"], "endpoint.decoding must be one of t1, greedy"),
    (["~gates.G5_kd_recovery"], "gates: expected exactly the keys"),
    (["evaluation.decodings.t1.samples_per_prompt=0"], "evaluation.decodings.t1.samples_per_prompt must be an integer >= 1"),
    (["teacher_pick.check_every=5000"], "teacher_pick.check_every must be at most teacher.sft_steps (2000)"),
    (["teacher_pick.min_accuracy=2"], "teacher_pick.min_accuracy must be in [0, 1]"),
    (["sft.robust_anneal_learning_rate=0"], "sft.robust_anneal_learning_rate must be a positive number"),
    (["sft.robust_anneal_steps=-1"], "sft.robust_anneal_steps must be an integer >= 0"),
    (["warm.horizons=[3]"], "warm.horizons must be a non-empty subset of horizons, got [3]"),
    (["distill.steps=150", "distill.eval_every=500"], "distill.eval_every must be at most distill.steps (150)"),
])
def test_each_bad_setting_stops_the_study_at_start_naming_its_key(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as refused:
        study_config(tmp_path, *overrides)
    assert message in str(refused.value)


def write_episodes(directory, name: str, outcomes: dict[int, tuple[bool, list[str]]], data) -> None:
    """An evaluation of one checkpoint, its rows as opd/evaluate.py writes them: line -> (correct, call statuses);
    no expected calls, so a call that ran is unchecked and a failed one a failed call (its expression no step), the
    tool world's answer to it followed by another turn: recoverable."""
    directory.mkdir(parents=True, exist_ok=True)
    call = '<tool_call>\n{{"name": "calculate_math", "arguments": {{"expression": "{}"}}}}\n</tool_call>'
    rows = [{**asdict(EpisodeScore(f"{data}:{line}", "answer", "", correct, 1, 1, 0, statuses,
                                   ["unchecked" if status == "ok" else "failed_call" for status in statuses],
                                   first_error="failed_call" if set(statuses) - {"ok"} else None,
                                   first_error_recoverable=bool(set(statuses) - {"ok"}))),
             "sample": 0, "turn_texts": [call.format("1" if status == "ok" else "1 +") for status in statuses]}
            for line, (correct, statuses) in outcomes.items()]
    (directory / f"episodes_{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_heldout(path, horizons: list[int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"task": {"horizon": h}}) + "\n" for h in horizons))


def test_checkpoint_scores_group_episodes_by_the_horizon_of_their_line(tmp_path):
    data = tmp_path / "heldout.jsonl"
    write_heldout(data, [1, 4, 4, 1])
    write_episodes(tmp_path / "eval", "m", {1: (True, ["ok"]), 2: (False, ["ok", "malformed"]),
                                            3: (True, ["undeclared", "ok", "ok"]), 4: (False, [])}, data)
    scores = checkpoint_scores(tmp_path / "eval", "m", {1: 1, 2: 4, 3: 4, 4: 1})
    assert scores[1]["correct"] == {1: True, 4: False} and scores[4]["correct"] == {2: False, 3: True}
    assert scores[4]["tool_error_rate"] == pytest.approx(2 / 5) and scores[4]["recovery_rate"] == pytest.approx(1 / 2)
    assert scores[1]["recovery_rate"] is None and scores[1]["error_episodes"] == 0
    assert scores["all"]["tool_error_rate"] == pytest.approx(2 / 6) and len(scores["all"]["correct"]) == 4


def test_checkpoint_scores_average_a_problems_samples(tmp_path):
    """Two samples per prompt (opd/evaluate.py samples_per_prompt=2): a problem's correctness is their mean."""
    outcomes = {1: (True, True), 2: (True, False), 3: (False, False)}
    rows = [{**asdict(EpisodeScore(f"h.jsonl:{line}", "answer", "", correct, 1, 1, 0, [], [])), "sample": sample}
            for line, samples in outcomes.items() for sample, correct in enumerate(samples)]
    (tmp_path / "episodes_m.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    scores = checkpoint_scores(tmp_path, "m", {1: 1, 2: 1, 3: 2})
    assert scores[1]["correct"] == {1: 1.0, 2: 0.5} and scores["all"]["correct"] == {1: 1.0, 2: 0.5, 3: 0.0}


def test_the_report_pairs_every_arm_with_the_baseline_per_horizon_and_decoding(tmp_path):
    """Two seeds, two arms, four held-out problems (two per horizon), two decodings: accuracies, per-seed levels,
    paired differences and the endpoint by hand."""
    cfg = study_config(tmp_path, "seeds=[0,1]", OPD_ARM, "arms=[opd]", "endpoint.arm=opd", "horizons=[1,2]",
                       "warm.horizons=[1]", "distill.steps=10", "distill.eval_every=5", "endpoint.horizon=2",
                       "distill.max_turns=6", "evaluation.max_turns=6", "data.match_noise=false", "curve.horizon=2",
                       "curve.problems=2")
    paths = StudyPaths(cfg)
    write_heldout(paths.file("heldout_prompts"), [1, 1, 2, 2])
    data = paths.file("heldout_prompts")
    # correctness per seed, line 1..4 (lines 1-2: horizon 1, lines 3-4: horizon 2); greedy: every episode correct
    table = {("student", 0): [1, 0, 0, 0], ("student", 1): [1, 1, 0, 0],
             ("kd", 0): [1, 1, 0, 0], ("kd", 1): [1, 0, 1, 0],
             ("opd", 0): [1, 1, 1, 0], ("opd", 1): [1, 1, 1, 1]}
    for decoding in ("t1", "greedy"):
        directory = paths.evaluation(None, "teacher_robust", decoding)
        write_episodes(directory, "robust", {line: (line != 4 or decoding == "greedy", ["ok"]) for line in range(1, 5)},
                       data)
        (directory / "evaluation.json").write_text(json.dumps({"checkpoints": [{"name": "robust"}]}))
        for (name, seed), correct in table.items():
            directory = paths.evaluation(seed, name, decoding)
            checkpoint = "student" if name == "student" else "step10"
            write_episodes(directory, checkpoint, {line: (bool(c) or decoding == "greedy",
                                                          ["ok"] if c else ["ok", "malformed"])
                                                   for line, c in enumerate(correct, 1)}, data)
            (directory / "evaluation.json").write_text(json.dumps({"checkpoints": [{"name": checkpoint}]}))
    # the learning curves: two problems of H=2, the warm student (step 0) and every arm's steps 5 and 10 per seed
    write_heldout(paths.curve_prompts(), [2, 2])
    curve = {("student", 0): {0: [0, 0]}, ("student", 1): {0: [1, 0]},
             ("kd", 0): {5: [1, 0], 10: [1, 0]}, ("kd", 1): {5: [0, 0], 10: [1, 0]},
             ("opd", 0): {5: [1, 1], 10: [1, 1]}, ("opd", 1): {5: [1, 0], 10: [1, 1]}}
    for (name, seed), by_step in curve.items():
        directory = paths.curve(seed, name)
        names = {step: "student" if name == "student" else f"step{step}" for step in by_step}
        for step, correct in by_step.items():
            write_episodes(directory, names[step], {line: (bool(c), ["ok"]) for line, c in enumerate(correct, 1)},
                           paths.curve_prompts())
        (directory / "evaluation.json").write_text(json.dumps({"checkpoints": [{"name": n} for n in names.values()]}))
    # the shared set: each arm's last checkpoint continues the warm student's prefixes; its entropy on held-out
    recoveries = {0: {"continued": 4, "correct": 3, "recovered": 2, "by_first_error": {
        "wrong_value": {"continued": 3, "correct": 3, "recovered": 2},
        "failed_call": {"continued": 1, "correct": 0, "recovered": 0}}},
        1: {"continued": 2, "correct": 2, "recovered": 2, "by_first_error": {
            "wrong_value": {"continued": 2, "correct": 2, "recovered": 2}}}}
    for seed in (0, 1):
        for name in ("kd", "opd"):
            (paths.arm(seed, name) / "run").mkdir(parents=True)
            (paths.arm(seed, name) / "run" / "metrics.jsonl").write_text("".join(
                json.dumps({"step": step, "elapsed_s": step * 0.7 + seed}) + "\n" for step in (5, 10)))
        paths.continuation(seed, "opd/recovery").write_text(json.dumps(recoveries[seed]))
        (paths.arm(seed, "opd") / "divergence.json").write_text(json.dumps({"teachers": {"robust": {"all": {
            "student_entropy": 1.0 + seed, "teacher_entropy": 0.2, "forward_kl": 0.1, "reverse_kl": 0.3}}}}))
        paths.student(seed).parent.mkdir(parents=True, exist_ok=True)
        paths.student(seed).with_suffix(".json").write_text(json.dumps({
            "min_accuracy": 0.5, "prompts": 60, "measured": [], "reached": not seed,
            "chosen": {"step": 850 + 1775 * seed, "checkpoint": "unused", "accuracy": 0.5 - 0.017 * seed}}))
        paths.divergence(seed).write_text(json.dumps({"teachers": {"robust": {"all": {
            "forward_kl": 0.1 * (seed + 1), "reverse_kl": 0.2, "top1_agreement": 0.9, "topk_overlap": 0.8}}},
            "pushes": {"robust": {"forward_kl": {"top_percent_share": 0.3, "raises": [
                {"id": 13, "token": ".", "per_1k_tokens": 8.5 - seed}]}}}}))
        paths.continuation(seed).write_text(json.dumps({"continued": 4, "correct": 3 - seed, **({} if seed else {
            "by_error_call": {"later_call": {"continued": 4, "correct": 3}},
            "by_misread_number": {"c": {"continued": 3, "correct": 2}, "input": {"continued": 1, "correct": 1}}})}))
        # G6: the warm student's own note probability after its recoverable errors (3 prefixes at 0.1, then 1 at 0.02)
        paths.continuation(seed, "student-continuation").write_text(json.dumps(
            {"continued": 3 - 2 * seed, "correct": 0, "note_probability": 0.1 if seed == 0 else 0.02}))
    report = study_report(cfg, paths, curve_steps(cfg))
    t1, greedy = report["decodings"]["t1"], report["decodings"]["greedy"]
    final = {arm: {h: t1["curves"][arm][h][-1] for h in (1, 2)} for arm in ("kd", "opd")}
    assert final["kd"][1]["accuracy"] == pytest.approx(0.75) and final["kd"][2]["accuracy"] == pytest.approx(0.25)
    assert final["opd"][1]["accuracy"] == pytest.approx(1.0) and final["opd"][2]["accuracy"] == pytest.approx(0.75)
    assert final["opd"][2]["se"] == pytest.approx(0.25)  # seeds 0.5 and 1.0: sd 0.354 / sqrt(2)
    assert t1["student"][1][0]["accuracy"] == pytest.approx(0.75)  # every arm's step 0
    assert greedy["curves"]["opd"][2][-1]["accuracy"] == 1.0 and greedy["paired_vs_baseline"]["opd"][2][-1]["mean"] == 0
    paired = t1["paired_vs_baseline"]["opd"][2][-1]
    assert paired["per_seed"] == pytest.approx([0.5, 0.5]) and paired["mean"] == pytest.approx(0.5)
    assert paired["se_seeds"] == pytest.approx(0.0)
    endpoint = dict(report["endpoint"])
    assert endpoint["minus_kd_per_seed"] == pytest.approx([0.5, 0.5])
    trend, interval = endpoint.pop("slope_over_horizons"), endpoint.pop("minus_kd_ci95")
    assert endpoint.pop("co_primary") == {}  # endpoint.versus (kd_rkl) did not run in this slice
    assert report["reading"]["verdict"] == "no answer" and "G0_teacher_t1_accuracy" in report["reading"]["why"]
    shared = report["shared_recovery"]
    assert shared["opd"]["all"] == {"continued": 6, "recovered": 4, "rate": pytest.approx(4 / 6)}
    assert shared["opd"]["wrong_value"] == {"continued": 5, "recovered": 4, "rate": pytest.approx(0.8)}
    assert shared["opd"]["failed_call"]["rate"] == 0.0 and shared["opd"]["seeds"] == [0, 1]
    assert shared["robust_teacher"]["all"] == {"continued": 8, "recovered": 5, "rate": pytest.approx(5 / 8)}
    assert "kd" not in shared  # its probe was not written
    assert report["entropy"]["opd"]["student_entropy"] == {"mean": pytest.approx(1.5), "se": pytest.approx(0.5)}
    assert {key: value for key, value in endpoint.items() if key != "minus_kd_per_seed"} == pytest.approx(
        {"arm": "opd", "horizon": 2, "decoding": "t1", "step": 10, "minus_kd": 0.5, "minus_kd_se": 0.0, "seeds": 2})
    assert interval == pytest.approx([0.5, 0.5])  # no spread over the seeds
    # opd minus kd at H = 1, 2: seed 0 0 then 0.5 (slope 0.5 per unit of H), seed 1 0.5 then 0.5 (slope 0)
    assert trend["per_seed"] == pytest.approx([0.5, 0.0]) and trend["mean"] == pytest.approx(0.25)
    assert trend["se"] == pytest.approx(0.25)  # sd 0.354 / sqrt(2)
    assert trend["ci95"] == pytest.approx([0.25 - 12.706 * 0.25, 0.25 + 12.706 * 0.25], abs=1e-3)  # t, 1 df
    # greedy, every episode of both arms correct: both seeds tie there; at T=1 no seed does
    assert report["ties"] == [{"seed": seed, "decoding": "greedy", "step": 10, "accuracy": 1.0} for seed in (0, 1)]
    levels = {(r["arm"], r["seed"], r["horizon"], r["decoding"], r["step"]): r["accuracy"] for r in report["per_seed"]}
    assert levels["opd", 0, 2, "t1", 10] == 0.5 and levels["opd", 1, 2, "t1", 10] == 1.0
    assert levels["warm_student", 1, "all", "t1", 0] == 0.5 and levels["kd", 0, "all", "greedy", 10] == 1.0
    assert len(report["per_seed"]) == 2 * 2 * 3 * (1 + 2)  # decodings x seeds x groups x (student + arms)
    teacher = t1["teachers"]["robust"]["all"]
    assert teacher["accuracy"] == 0.75 and teacher["se_problems"] == pytest.approx(0.25)  # sd 0.5 / sqrt(4)
    assert report["divergence"]["robust"]["all"]["forward_kl"] == pytest.approx(0.15)
    assert [report["pushes"][seed]["robust"]["forward_kl"]["raises"][0]["per_1k_tokens"] for seed in "01"] == [8.5, 7.5]
    assert final["opd"][2]["wall_s"] == pytest.approx(7.5)  # 7 and 8 s at step 10
    assert final["kd"][2]["recovery_rate"] == pytest.approx(0.0)  # every episode with a failed call was wrong
    gates = report["gates"]
    assert gates["G0_teacher_t1_accuracy"] == {**gates["G0_teacher_t1_accuracy"], "value": 0.75, "passed": False}
    assert gates["G3_kd_horizon_drop"]["value"] == pytest.approx(0.5) and gates["G3_kd_horizon_drop"]["passed"]
    assert gates["G4_teacher_continuation"]["value"] == pytest.approx(5 / 8) and not gates["G4_teacher_continuation"]["passed"]
    assert report["continuation"] == {  # seed 1's file predates the breakdowns: it adds to neither
        "by_error_call": {"later_call": {"continued": 4, "correct": 3}},
        "by_misread_number": {"c": {"continued": 3, "correct": 2}, "input": {"continued": 1, "correct": 1}}}
    assert gates["G5_kd_recovery"]["value"] == 0.0 and gates["G5_kd_recovery"]["direction"] == "at most"
    assert gates["G5_kd_recovery"]["passed"] is True
    assert gates["G1_student_intermediate_errors"]["value"] is None  # these rows carry no expected calls
    # the students' T=1 calls: seed 0 one right episode (1 call) and three wrong (2 calls, the second failed), seed 1
    # two and two: 13 calls at risk (none after a first error), 5 first errors
    noise_match = dict(report["noise_match"])
    assert noise_match.pop("guard_numbers") == {"a": 0.089, "b": 0.093, "c": 0.155, "m": 0.164}
    assert noise_match == pytest.approx({"calls_at_risk": 13, "confused": 0.0, "wrong_value": 0.0,
                                                   "wrong_operation": 0.0, "guard_failed": 0.0, "failed_call": 5 / 13,
                                                   "broken_json": 0.0,
                                                   "wrong_k_share": None, "wrong_guard_share": None,
                                                   "wrong_guard_numbers": None,
                                                   "value_noise": 0.229, "syntax_noise": 0.026, "operand_share": 0.05,
                                                   "guard_share": 0.335})
    # G6 pooled over the prefixes: (3 x 0.1 + 1 x 0.02) / 4; G7: the students' 5 recoverable first errors (a failed
    # call, then a turn), none ended correct
    assert gates["G6_student_retry_note"]["value"] == pytest.approx(0.08) and gates["G6_student_retry_note"]["passed"]
    assert gates["G7_student_recovery"] == {**gates["G7_student_recovery"], "value": 0.0, "passed": False,
                                            "detail": "warm students, 5 recoverable first errors, all horizons"}
    rows = summary_results(report)
    assert {(row["arm"], row["horizon"], row["decoding"]) for row in rows} == {
        (a, h, d) for a in ("kd", "opd") for h in (1, 2, "all") for d in ("t1", "greedy")}
    opd_all = next(row for row in rows if row["arm"] == "opd" and row["horizon"] == "all" and row["decoding"] == "t1")
    # two problems per horizon: seed 0 opd minus kd 0 and 0.5 -> 0.25 over all, seed 1 0.5 and 0.5 -> 0.5
    assert opd_all["minus_kd_per_seed"] == pytest.approx([0.25, 0.5]) and opd_all["minus_kd"] == pytest.approx(0.375)
    assert opd_all["minus_kd_se"] == pytest.approx(0.125)
    opd_h2 = next(row for row in rows if row["arm"] == "opd" and row["horizon"] == 2 and row["decoding"] == "t1")
    assert {key: opd_h2[key] for key in ("on_policy", "accuracy", "se", "minus_kd", "minus_kd_se")} == pytest.approx(
        {"on_policy": True, "accuracy": 0.75, "se": 0.25, "minus_kd": 0.5, "minus_kd_se": 0.0})
    kd_h1 = next(row for row in rows if row["arm"] == "kd" and row["horizon"] == 1)
    assert kd_h1["on_policy"] is False and kd_h1["minus_kd"] == 0.0
    learning = report["curve"]
    assert {key: learning[key] for key in ("horizon", "decoding", "problems", "steps", "samples_per_prompt")} == {
        "horizon": 2, "decoding": "t1", "problems": 2, "steps": [0, 5, 10], "samples_per_prompt": 4}
    kd, opd = (learning["arms"][arm]["points"] for arm in ("kd", "opd"))
    assert [p["per_seed"] for p in kd] == [[0, 0.5], [0.5, 0], [0.5, 0.5]]
    assert [p["per_seed"] for p in opd] == [[0, 0.5], [1, 0.5], [1, 1]]
    assert [p["accuracy"] for p in opd] == pytest.approx([0.25, 0.75, 1.0])
    assert [p["se"] for p in opd] == pytest.approx([0.25, 0.25, 0.0])
    assert [p["wall_s"] for p in opd] == pytest.approx([0.0, 4.0, 7.5])  # the mean over seeds of elapsed_s
    assert [p["minus_baseline_per_seed"] for p in opd] == [[0, 0], [0.5, 0.5], [0.5, 0.5]]
    assert "minus_baseline" not in kd[0]
    # the area, per seed the trapezoid over steps 0, 5, 10 divided by 10: kd 0.375 and 0.25, opd 0.75 and 0.625
    for arm, per_seed, mean in (("kd", [0.375, 0.25], 0.3125), ("opd", [0.75, 0.625], 0.6875)):
        area = learning["arms"][arm]["area"]
        assert area["per_seed"] == pytest.approx(per_seed) and (area["mean"], area["se"]) == pytest.approx((mean, 0.0625))
    charts = write_study_charts(report, tmp_path / "charts")
    assert [chart.name for chart in charts] == ["accuracy_vs_horizon.png", "accuracy_vs_steps.png"]
    assert all(chart.read_bytes().startswith(b"\x89PNG") for chart in charts)
    console = Console(file=io.StringIO(), width=200)
    print_report(report, console)
    printed = console.file.getvalue()
    assert "endpoint (pre-registered): opd minus kd at H=2, t1, step 10: 0.500 ± 0.000" in printed
    assert "95 % interval +0.500 to +0.500" in printed and "its slope over H, per unit of H: 0.250 ± 0.250" in printed
    assert "tie: seed 1, greedy, step 10: every arm scored the same at every horizon (1.000 over all)" in printed
    assert "G4 by the number misread: c 2 of 3, input 1 of 1" in printed
    assert any(line.startswith("│ opd │ 0.250 ± 0.250 │ 0.750 ± 0.250 │ 1.000 ± 0.000 │")
               and line.endswith(" 0.688 ± 0.062 │") for line in printed.splitlines())  # the curve and its area
    assert "│ 1    │ robust  │ forward_kl │ 0.30    │ '.' +7.5" in printed
    assert ("warm students (SFT step, validation accuracy): seed 0 step 850 (0.500), seed 1 step 2625 (0.483, short "
            "of 0.5: the best by the cap)") in printed
    assert report["warm_picks"]["1"] == {"step": 2625, "accuracy": 0.483, "reached": False, "min_accuracy": 0.5}


def test_a_sitting_projects_each_stage_from_the_third_pilots_times_of_its_kind(tmp_path):
    cfg = study_config(tmp_path)
    pilot = json.loads(PILOT_TIMES.read_text())["stage_wall_s"]
    stages = {stage.name: stage for stage in with_estimates(study_stages(cfg), list(cfg.arm_settings))}
    assert stages["seed3-student"].estimate_s == stages["seed0-student"].estimate_s == pilot["seed0-student"]
    assert stages["teacher-robust"].estimate_s == pilot["teacher-robust"]
    parts = ("kd", "kd-curve", "kd-eval-t1", "kd-eval-greedy", "continuation", "divergence")
    assert stages["seed4-opd_rkl"].estimate_s == pytest.approx(sum(pilot[f"seed0-{part}"] for part in parts))
    assert all(stage.estimate_s is not None for stage in stages.values())


def test_the_reading_rule_needs_every_gate_and_both_co_primary_intervals():
    passed = {"G0": {"passed": True}, "G4": {"passed": True}}
    endpoint = {"minus_kd_ci95": [0.01, 0.2], "co_primary": {"kd_rkl": {"ci95": [0.02, 0.1]}}}
    assert reading(endpoint, passed)["verdict"] == "supported"
    assert reading({**endpoint, "co_primary": {"kd_rkl": {"ci95": [-0.1, 0.1]}}}, passed)["verdict"] == "undecided"
    refuted = {"minus_kd_ci95": [-0.2, 0.05], "co_primary": {"kd_rkl": {"ci95": [-0.1, 0.059]}}}
    assert reading(refuted, passed)["verdict"] == "refuted"
    assert reading({**refuted, "minus_kd_ci95": [-0.2, 0.06]}, passed)["verdict"] == "undecided"  # not below +0.06
    failed = reading(endpoint, {**passed, "G4": {"passed": False}})
    assert failed["verdict"] == "no answer" and failed["why"] == "gate(s) G4 not passed"
    assert reading(endpoint, {**passed, "G4": {"passed": None}})["verdict"] == "no answer"  # not measured
    assert reading(None, passed)["verdict"] == "no answer"


def test_the_curve_problems_are_the_first_of_their_horizon_in_file_order(tmp_path):
    heldout, out = tmp_path / "heldout.jsonl", tmp_path / "curve.jsonl"
    write_heldout(heldout, [1, 6, 2, 6, 6, 1])
    curve_main(["--heldout", str(heldout), "--horizon", "6", "--problems", "2", "--out", str(out)])
    assert out.read_text() == heldout.read_text().splitlines(keepends=True)[1] + heldout.read_text().splitlines(
        keepends=True)[3]
    ran = run_main(curve_main, "--heldout", str(heldout), "--horizon", "6", "--problems", "4", "--out", str(out),
                   program="curve_problems.py", hydra=False)
    assert ran.returncode == 2 and ran.stderr.splitlines()[-1] == (
        f"curve_problems.py: error: {heldout} holds 3 problems of horizon 6, fewer than the 4 asked for "
        "(curve.problems)")


def test_intermediate_calls_are_those_past_the_first_expected_call_and_within_the_horizon():
    """An H=3 episode: a correct first call (not intermediate), a wrong value at position 1, its retry, broken JSON
    at position 2, a correct call, an extra call (past the horizon): the intermediate calls and which errors can be
    recovered from (answered by the tool world, with a turn left)."""
    call = '<tool_call>{"name": "calculate_math", "arguments": {"expression": "1"}}</tool_call>'
    row = {"expected_calls": 3, "turn_texts": [call, call, call, "<tool_call>{broken</tool_call>", call, call, "ok"],
           "call_types": ["correct", "wrong_value", "correct", "broken_json", "correct", "extra_call"]}
    assert intermediate_calls(row, max_turns=10) == [("wrong_value", True), ("correct", True), ("broken_json", False),
                                                     ("correct", True)]
    assert intermediate_calls(row, max_turns=2)[0] == ("wrong_value", False)  # its turn (the 2nd) was the last one
    assert intermediate_calls({**row, "expected_calls": None}, max_turns=10) == []


@pytest.mark.slow
@pytest.mark.timeout(3600)  # three invocations of every stage kind; minutes on an idle machine, more on a busy one
def test_the_study_runs_end_to_end_gates_first_and_writes_its_summary(tmp_path, tokenizer_path):
    """Every stage of a minute-sized study (one seed, three arms, one horizon) runs as its real command. Gates
    first: with a gate failed, the study stops after the baseline's slice (the stop rule); with them passed, the
    other arms run (kd_rkl on kd's kept teacher rollouts), and a last invocation skips every stage."""
    tiny = [f"out_dir={tmp_path}", f"tokenizer={tokenizer_path}", "seeds=[0]", OPD_ARM, "arms=[opd,kd_rkl]",
            "endpoint.arm=opd", "horizons=[1]", "warm.horizons=[1]", "warm.check_every=1", "warm.prompts=2",
            "warm.min_accuracy=0", "endpoint.horizon=1", "teacher_pick.check_every=1", "teacher_pick.prompts=2",
            "teacher_pick.min_accuracy=0", "data.train=6", "data.distill=4", "teacher.sft_steps=2",
            "student.sft_steps=2", "teacher.hidden_size=32", "teacher.num_hidden_layers=1", "student.hidden_size=32",
            "student.num_hidden_layers=1", "distill.steps=2", "distill.eval_every=1", "distill.batch_size=2",
            "distill.max_gen_len=8", "evaluation.max_gen_len=8", "divergence.prompts=2", "distill.max_turns=4",
            "evaluation.max_turns=4", "curve.problems=3", "data.match_noise=false",
            *(f"gates.{gate}={1.0 if gate == 'G5_kd_recovery' else 0.0}" for gate in GATES)]  # random models pass
    command = [sys.executable, "-m", "experiments.study.study", *tiny]
    stopped = subprocess.run([*command, "gates.G0_teacher_t1_accuracy=1.01"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=1200)
    assert stopped.returncode == 0, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    assert "stop rule: G0_teacher_t1_accuracy failed" in " ".join(stopped.stdout.split())
    assert json.loads((tmp_path / "gates.json").read_text())["G0_teacher_t1_accuracy"]["passed"] is False
    logs = {path.stem for path in (tmp_path / "logs").iterdir()}
    assert "seed0-kd" in logs and not {"seed0-opd", "seed0-kd_rkl"} & logs and not (tmp_path / "study_summary.json").exists()
    first = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    started = re.findall(r"(\S+): started", first.stdout)
    assert sorted(started) == ["seed0-kd_rkl", "seed0-opd"]  # the baseline's slice was done
    assert "restored" in (tmp_path / "logs" / "seed0-kd_rkl.log").read_text()
    summary = json.loads((tmp_path / "study_summary.json").read_text())
    assert summary["seeds"] == [0] and summary["horizons"] == [1]
    assert {(row["arm"], row["horizon"], row["decoding"]) for row in summary["results"]} == {
        (arm, horizon, decoding) for arm in ("kd", "opd", "kd_rkl") for horizon in (1, "all")
        for decoding in ("t1", "greedy")}
    assert set(summary["gates"]) == set(GATES) and summary["endpoint"]["arm"] == "opd"
    assert set(summary["endpoint"]["co_primary"]) == {"kd_rkl"} and summary["reading"]["verdict"] == "no answer"
    assert set(summary["shared_recovery"]) >= {"warm_student", "robust_teacher"}
    assert set(summary["entropy"]) == {"kd", "opd", "kd_rkl"}
    assert summary["stages"]["seed0-opd"]["cpu"] and set(summary["stages"]) == set(summary["commands"])
    assert {(row["arm"], row["decoding"]) for row in summary["per_seed"]} == {
        (arm, decoding) for arm in ("warm_student", "kd", "opd", "kd_rkl") for decoding in ("t1", "greedy")}
    assert (tmp_path / "accuracy_vs_horizon.png").is_file() and (tmp_path / "accuracy_vs_steps.png").is_file()
    assert summary["curves"]["steps"] == [0, 1, 2] and summary["curves"]["problems"] == 3
    assert {arm: len(curve["points"]) for arm, curve in summary["curves"]["arms"].items()} == {
        "kd": 3, "opd": 3, "kd_rkl": 3}
    assert max(summary["stage_wall_s"].values()) <= summary["wall_s_from_nothing"] <= summary["stage_wall_s_total"]
    # the arms' last weights are kept as safetensors; git would keep the manifest's outputs and the report only
    final = tmp_path / "seed0" / "opd" / "student_final_32.safetensors"
    assert final.is_file() and "!/seed0/opd/student_final_32.safetensors" in (tmp_path / ".gitignore").read_text()
    again = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "started" not in again.stdout


def test_token_agreement_against_hand_calculations():
    import math

    import torch

    from experiments.study.divergence import token_agreement

    student = torch.tensor([[2.0, 1.0, 0.0, -1.0], [1.0, 0.5, 0.0, -0.5]])
    teacher = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, -1.0, 1.0]])
    figures = token_agreement(student, teacher, top_k=2)
    assert figures["forward_kl"][0].item() == pytest.approx(0.0, abs=1e-6)
    p, q = torch.softmax(teacher[1].double(), 0).tolist(), torch.softmax(student[1].double(), 0).tolist()
    assert figures["forward_kl"][1].item() == pytest.approx(sum(a * math.log(a / b) for a, b in zip(p, q, strict=True)), rel=1e-5)
    assert figures["reverse_kl"][1].item() == pytest.approx(sum(b * math.log(b / a) for a, b in zip(p, q, strict=True)), rel=1e-5)
    assert figures["top1_agreement"].tolist() == [1.0, 0.0]  # argmax: the student's id 0, the teacher's id 1
    assert figures["topk_overlap"].tolist() == [1.0, 0.5]  # top 2: the student's {0, 1}, the teacher's {1, 3}
    assert figures["student_entropy"][1].item() == pytest.approx(-sum(b * math.log(b) for b in q), rel=1e-5)
    assert figures["teacher_entropy"][1].item() == pytest.approx(-sum(a * math.log(a) for a in p), rel=1e-5)


def test_logit_pushes_are_minus_the_divergences_gradients_and_the_report_lists_the_largest():
    """Each direction's push is minus the autograd gradient of its summed divergence (the loss OPD minimizes) with
    respect to the student's logits, summed over positions; forward KL raises a token the teacher is sure of where
    the student gives it almost nothing in full, reverse KL hardly at all; the top 1 % share and the report's
    per-1,000-token masses follow."""
    import torch

    from experiments.study.divergence import logit_pushes, push_report, top_percent_share
    from opd.config import LossConfig
    from opd.training.loss import token_divergence

    student = torch.tensor([[4.0, 0.0, -6.0], [0.5, 1.0, 0.0]], dtype=torch.float64)
    teacher = torch.tensor([[0.0, 0.0, 6.0], [1.0, 0.0, -1.0]], dtype=torch.float64)
    pushes = logit_pushes(student, teacher)
    for direction in ("forward_kl", "reverse_kl"):
        logits = student.clone().requires_grad_(True)
        token_divergence(logits, teacher, LossConfig(direction, 1.0, 0.5)).sum().backward()
        assert torch.allclose(pushes[direction], -logits.grad.sum(dim=0), atol=1e-12), direction
    first = logit_pushes(student[:1], teacher[:1])  # the teacher puts 0.995 on id 2, the student 4.5e-5
    assert first["forward_kl"][2].item() > 0.99 and 0 < first["reverse_kl"][2].item() < 0.01
    assert top_percent_share([0.0, 3.0, 1.0]) == pytest.approx(0.75)  # one entry of three: the largest
    assert top_percent_share([0.0] * 4) == 0.0

    class Tokenizer:
        def decode(self, ids):
            return "abc"[ids[0]]

    report = push_report(pushes, {"forward_kl": [3.0, 1.0], "reverse_kl": [1.0, 1.0]}, 2, Tokenizer(), 2)
    assert [row["token"] for row in report["forward_kl"]["raises"]] == ["c", "b"]  # +0.90, -0.28 (a: -0.62)
    assert report["forward_kl"]["raises"][0]["per_1k_tokens"] == pytest.approx(500 * pushes["forward_kl"][2].item())
    assert report["forward_kl"]["top_percent_share"] == pytest.approx(0.75)


def test_the_warm_start_is_the_first_kept_checkpoint_reaching_the_threshold(tmp_path, tokenizer_path):
    """Random tiny weights answer nothing: a threshold of 0 takes the first kept step (in step order, 50 before
    100), a threshold of 1 fails naming the best step, or with --best-if-none picks the best (the earliest of equals:
    step 50) and says it fell short; every accuracy measured is written beside the choice."""
    import torch

    from common.minimind.model import build_model, save_native
    from common.minimind.spec import MiniMindArch
    from experiments.study.chain_task import write_task

    files = write_task(tmp_path / "task", train=2, distill=2, seed=1)["files"]
    run = tmp_path / "sft"
    run.mkdir()
    for step in (100, 50):
        torch.manual_seed(step)
        save_native(build_model(MiniMindArch(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                             num_key_value_heads=1)), run / f"s_32_step{step}.pth")
    from experiments.study.warm_start import main

    command = ["--run-dir", str(run), "--stem", "s_32", "--arch", "32,1,2,1", "--data", files["distill_prompts"],
               "--tokenizer", str(tokenizer_path), "--prompts", "3", "--max-turns", "3", "--max-gen-len", "4",
               "--out", str(tmp_path / "warm.pth")]
    first = run_main(main, *command, "--min-accuracy", "0", hydra=False)
    assert first.returncode == 0, first.stderr[-2000:]
    assert (tmp_path / "warm.pth").read_bytes() == (run / "s_32_step50.pth").read_bytes()
    assert json.loads((tmp_path / "warm.json").read_text())["chosen"]["step"] == 50
    refused = run_main(main, *command, "--min-accuracy", "1", hydra=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith(f"error: no SFT checkpoint in {run} reached validation accuracy 1.0")
    assert [row["step"] for row in json.loads((tmp_path / "warm.json").read_text())["measured"]] == [50, 100]
    best = run_main(main, *command, "--min-accuracy", "1", "--best-if-none", hydra=False)
    assert best.returncode == 0, best.stderr[-2000:]
    picked = json.loads((tmp_path / "warm.json").read_text())
    assert picked["reached"] is False and picked["chosen"]["step"] == 50  # both 0: the earliest of equals
    assert [row["accuracy"] for row in picked["measured"]] == [0.0, 0.0]
    assert (tmp_path / "warm.pth").read_bytes() == (run / "s_32_step50.pth").read_bytes()
    assert "no checkpoint reached validation accuracy 1.0: picked the best, step 50 (0.000)" in best.stdout


def continuation_rows(data) -> list[dict]:
    """Scripted T=1 episodes of the held-out prompt on line 1, (13 - 6) % 20 at every step: a wrong value at the
    second call, broken JSON at the first call, a wrong value in the last allowed turn, and a clean episode."""
    def call(expression):
        return f'<tool_call>{{"name": "calculate_math", "arguments": {{"expression": "{expression}"}}}}</tool_call><|im_end|>'

    base = {"source": f"{data}:1", "stop_reason": "answer", "final_answer": "", "correct": False, "turns": 3,
            "assistant_tokens": 9, "teacher_tokens": 0, "call_statuses": [], "expected_calls": 4, "gt": []}
    # first_error_recoverable as opd.episodes.scoring writes it: the tool world answered the first error and a turn followed
    return [
        {**base, "sample": 0, "turn_texts": [call("(13 - 6) % 20"), call("(7 - 5) % 20"), "The result is 1.<|im_end|>"],
         "call_types": ["correct", "wrong_value"], "first_error": "wrong_value", "first_error_recoverable": True},
        {**base, "sample": 1, "turn_texts": ["<tool_call>{oops</tool_call><|im_end|>"], "call_types": ["broken_json"],
         "first_error": "broken_json", "first_error_recoverable": False},
        {**base, "sample": 2, "turn_texts": [call("(13 - 6) % 20")] * 3 + [call("(1 - 7) % 20")],
         "call_types": ["correct"] * 3 + ["wrong_value"], "first_error": "wrong_value",
         "first_error_recoverable": False},
        {**base, "sample": 3, "turn_texts": [call("(13 - 6) % 20"), "The result is 7.<|im_end|>"], "call_types": ["correct"],
         "first_error": None, "first_error_recoverable": False},
    ]


def test_the_teacher_continues_each_recoverable_post_error_prefix_with_the_turns_left(tmp_path):
    """The prefix ends with the first error's turn and the tool world's observations of every call turn before it;
    broken JSON (no observation: the episode ended) and an error in the last allowed turn are not continued."""
    from common.chat_records import load_agent_records
    from experiments.study.chain_task import make_record
    from experiments.study.continuation import continuation_records, first_error

    data = tmp_path / "heldout.jsonl"
    data.write_text(json.dumps(make_record((13, "-", 6), 4, demonstration=False)) + "\n")
    record = load_agent_records(data)[0][0]
    rows = continuation_rows(data)
    assert [first_error(row) for row in rows] == [(1, 1, "wrong_value"), (0, 0, "broken_json"), (3, 3, "wrong_value"),
                                                  None]
    by_budget, skipped = continuation_records(rows, {record.source: record}, 4, "<|im_end|>")
    assert skipped == {"broken_json": 1, "no_turn_left": 1}
    [(prefix, kind, call, row)] = by_budget[2]  # 4 turns allowed, 2 used
    assert row is rows[0]
    assert kind == "wrong_value" and call == 1 and list(by_budget) == [2]
    assert prefix.source == f"{data}:1#sample0" and prefix.gt == record.gt and prefix.tools == record.tools
    added = prefix.messages[len(record.messages):]
    assert [(m["role"], m["content"]) for m in added] == [
        ("assistant", rows[0]["turn_texts"][0].removesuffix("<|im_end|>")), ("tool", '{"result": "7"}'),
        ("assistant", rows[0]["turn_texts"][1].removesuffix("<|im_end|>")), ("tool", '{"result": "2"}')]


def test_the_continuation_command_writes_its_counts(tmp_path, tokenizer_path):
    """A random tiny teacher continues the one recoverable prefix: the report counts it (whatever the answer)."""
    import torch

    from common.minimind.model import build_model, save_native
    from common.minimind.spec import MiniMindArch
    from experiments.study.chain_task import make_record
    from experiments.study.continuation import main

    data = tmp_path / "heldout.jsonl"
    data.write_text(json.dumps(make_record((13, "-", 6), 4, demonstration=False)) + "\n")
    episodes = tmp_path / "episodes_student.jsonl"
    episodes.write_text("".join(json.dumps(row) + "\n" for row in continuation_rows(data)))
    torch.manual_seed(0)
    save_native(build_model(MiniMindArch(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1)), tmp_path / "teacher.pth")
    result = run_main(main, "--episodes", str(episodes), "--data", str(data), "--tokenizer", str(tokenizer_path),
                      "--model", str(tmp_path / "teacher.pth"), "--arch", "32,1,2,1", "--max-turns", "4",
                      "--max-gen-len", "4", "--out", str(tmp_path / "continuation.json"),
                      "--episodes-out", str(tmp_path / "continued.jsonl"), hydra=False)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "continuation.json").read_text())
    assert {key: report[key] for key in ("episodes", "error_episodes", "continued", "not_continued")} == {
        "episodes": 4, "error_episodes": 3, "continued": 1, "not_continued": {"broken_json": 1, "no_turn_left": 1}}
    assert report["by_first_error"]["wrong_value"]["continued"] == 1 and report["rate"] in (0.0, 1.0)
    assert report["by_error_call"] == {"later_call": {"continued": 1, "correct": report["correct"],
                                                      "recovered": report["recovered"]}}
    assert report["recovered"] <= report["correct"] and report["recovered_rate"] == report["recovered"]
    assert report["by_misread_number"] == {"k": {"continued": 1, "correct": report["correct"]}}  # (7 - 5) for (7 - 6)
    [row] = [json.loads(line) for line in (tmp_path / "continued.jsonl").read_text().splitlines()]
    assert row["misread_number"] == "k"
    assert {key: row[key] for key in ("source", "first_error", "error_call", "turns_left", "correct")} == {
        "source": f"{data}:1#sample0", "first_error": "wrong_value", "error_call": 1, "turns_left": 2,
        "correct": bool(report["correct"])}
    assert 1 <= len(row["turn_texts"]) <= 2 and len(row["call_types"]) <= len(row["turn_texts"])


def test_the_noise_is_matched_to_first_errors_per_call_at_risk(tmp_path):
    """A wrong value makes every later call of the chain wrong too: only the first error of an episode counts, over
    the calls made before it (where a demonstration injects its noise)."""
    from experiments.study.gates import student_error_rates

    cfg = study_config(tmp_path, "seeds=[0]", "data.match_noise=false")
    paths = StudyPaths(cfg)
    episodes = paths.evaluation(0, "student", "t1")
    episodes.mkdir(parents=True)
    gold = ["(13 - 6) % 20", "(7 - 6) % 20", "(1 - 6) % 20", "(15 - 6) % 20"]  # start 13, subtract six
    paths.data.mkdir(parents=True)
    paths.file("heldout_prompts").write_text(json.dumps({"expected_calls": [
        {"name": "calculate_math", "arguments": {"expression": text}} for text in gold]}) + "\n")

    def row(types: list[str], said: list[str]) -> dict:
        texts = [f'<tool_call>\n{{"name": "calculate_math", "arguments": {{"expression": "{text}"}}}}\n</tool_call>'
                 for text in said]
        return {"call_types": types, "source": "heldout_prompts.jsonl:1", "turn_texts": texts}

    rows = [row(["correct", "wrong_value", "wrong_value", "wrong_value"],  # 2 at risk, one first error: the input
                [gold[0], "(8 - 6) % 20", "(2 - 6) % 20", "(16 - 6) % 20"]),
            row(["correct", "correct", "failed_call", "correct"],  # 3 at risk, a failed call
                [gold[0], gold[1], "(1 - 6) %", gold[2]]),
            row(["broken_json"], []),  # 1 at risk
            row(["correct", "correct"], gold[:2]),  # 2 at risk, no error
            row(["wrong_value", "wrong_value"], ["(13 - 5) % 20", "(8 - 6) % 20"]),  # 1 at risk: k alone
            row(["wrong_value"], ["(12 - 5) % 20"]),  # 1 at risk: the input (and k)
            # a checked task's call whose guard failed (the input 12 is not 2 - 9): 1 at risk, a confused call
            row(["failed_call"], ["1 // 0 ** ((2 - 9 - 12) % 20) * (12 - 6) % 20"]),
            # and one whose step is right but its guard's check misread (3 for 2): 1 at risk, a guard operand
            row(["failed_call"], ["1 // 0 ** ((3 - 9 - 13) % 20) * (13 - 6) % 20"])]
    rows[2]["turn_texts"] = ["<tool_call>\n{broken\n</tool_call>"]
    (episodes / "episodes_student.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rates = student_error_rates(cfg, paths)
    assert (rates.pop("guard_numbers"), rates.pop("wrong_guard_numbers")) == ({"a": 0.089, "b": 0.093, "c": 0.155,
                                                                                "m": 0.164}, {})
    assert rates == pytest.approx({
        "calls_at_risk": 12, "confused": 5 / 12, "wrong_value": 3 / 12, "wrong_operation": 0.0,
        "guard_failed": 2 / 12, "failed_call": 1 / 12, "broken_json": 1 / 12, "wrong_k_share": 1 / 5,
        "wrong_guard_share": 1 / 5, "value_noise": 0.229, "syntax_noise": 0.026, "operand_share": 0.05,
        "guard_share": 0.335})


def test_the_noise_match_names_the_guard_number_a_student_misread(tmp_path):
    """Of the first errors whose step is right and whose guard failed, which guard number differs from the gold
    call's: the check's a or b, the operand check's c or m, or several (the share guard_numbers is set from)."""
    from experiments.study.gates import student_error_rates

    cfg, paths = _guard_failures(tmp_path, "data.match_noise=false")
    rates = student_error_rates(cfg, paths)
    assert rates["guard_failed"] == 0.5 and rates["wrong_guard_share"] == pytest.approx(5 / 6)
    assert rates["wrong_guard_numbers"] == pytest.approx({"b": 1 / 5, "c": 2 / 5, "m": 1 / 5, "several": 1 / 5})
    assert rates["guard_numbers"] == {"a": 0.089, "b": 0.093, "c": 0.155, "m": 0.164}  # the configured: not matched


def test_matched_noise_is_measured_on_every_seeds_warm_student_before_the_noisy_files_are_written(tmp_path):
    """data.match_noise: a noise-match stage reads every seed's T=1 student episodes, the noisy files take its rates,
    and the gold data's stage keeps its command (so the teachers and students of a run without it are reused)."""
    plain = {stage.name: stage for stage in study_stages(study_config(tmp_path, "seeds=[0,1]", "data.match_noise=false"))}
    cfg = study_config(tmp_path, "seeds=[0,1]", "data.match_noise=true")
    paths, stages = StudyPaths(cfg), {stage.name: stage for stage in study_stages(cfg)}
    match, noisy = stages["noise-match"], stages["noisy-data"]
    assert match.needs == ("seed0-student-eval-t1", "seed1-student-eval-t1") and match.outputs == [paths.noise_rates()]
    episodes = [match.command[i + 1] for i, part in enumerate(match.command) if part == "--episodes"]
    assert episodes == [str(stages[f"seed{seed}-student-eval-t1"].outputs[0].parent / "episodes_student.jsonl.gz")
                        for seed in (0, 1)]  # beside the evaluation.json the stage it needs writes
    assert noisy.needs == ("noise-match",)
    assert noisy.command[noisy.command.index("--noise-rates") + 1] == str(paths.noise_rates())
    assert not {"--value-noise", "--syntax-noise", "--guard-numbers"} & set(noisy.command)
    assert stages["data"].command == plain["data"].command and plain["noisy-data"].needs == ()
    assert "noise-match" not in plain and stages["teacher-robust-sft"].needs == ("teacher-gold", "noisy-data")


def _guard_failures(tmp_path, *overrides) -> tuple[StudyConfig, StudyPaths]:
    """An operand-checked study whose seed-0 student made 12 calls at risk: 6 single correct calls, then 6 first
    calls whose guard failed: c misread twice, m once, b once, c and m together once, the input once."""
    cfg = study_config(tmp_path, "seeds=[0]", "data.match_noise=true", *overrides)  # operand-checked, noise matched
    paths = StudyPaths(cfg)
    episodes = paths.evaluation(0, "student", "t1")
    episodes.mkdir(parents=True)
    gold = "1 // 0 ** ((2 - 9 - 13) % 20 + (10 - 4 - 6) % 20) * (13 - 6) % 20"  # start 13 = 2 - 9, six = 10 - 4
    paths.data.mkdir(parents=True)
    paths.file("heldout_prompts").write_text(json.dumps({"expected_calls": [
        {"name": "calculate_math", "arguments": {"expression": gold}},
        {"name": "calculate_math", "arguments": {"expression": "(7 - 6) % 20"}}]}) + "\n")
    said = [gold] * 6 + [
        "1 // 0 ** ((2 - 9 - 13) % 20 + (11 - 4 - 6) % 20) * (13 - 6) % 20",  # c
        "1 // 0 ** ((2 - 9 - 13) % 20 + (11 - 4 - 6) % 20) * (13 - 6) % 20",  # c
        "1 // 0 ** ((2 - 9 - 13) % 20 + (10 - 3 - 6) % 20) * (13 - 6) % 20",  # m
        "1 // 0 ** ((2 - 8 - 13) % 20 + (10 - 4 - 6) % 20) * (13 - 6) % 20",  # b
        "1 // 0 ** ((2 - 9 - 13) % 20 + (12 - 6 - 6) % 20) * (13 - 6) % 20",  # c and m
        "1 // 0 ** ((2 - 9 - 12) % 20 + (10 - 4 - 6) % 20) * (12 - 6) % 20"]  # the input: not a guard number
    rows = [{"call_types": ["correct" if text == gold else "failed_call"], "source": "heldout_prompts.jsonl:1",
             "turn_texts": [f'<tool_call>\n{{"name": "calculate_math", "arguments": {{"expression": "{text}"}}}}'
                            "\n</tool_call>"]} for text in said]
    (episodes / "episodes_student.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return cfg, paths


def test_noise_match_sets_the_noise_from_the_students_first_errors(tmp_path, capsys):
    """By hand: 6 confused first calls in 12 at risk; of the 6 that read back 5 misread a guard number (c 2, m 1,
    b 1, c and m 1: left out, the noise misreads one number), none k alone. The noisy files are then written at
    those rates, and the report shows them as the injected ones."""
    from experiments.study import chain_task, noise_match
    from experiments.study.gates import student_error_rates

    cfg, paths = _guard_failures(tmp_path)
    noise_match.main(["--heldout", str(paths.file("heldout_prompts")), "--episodes",
                      str(paths.evaluation(0, "student", "t1") / "episodes_student.jsonl"),
                      "--out", str(paths.noise_rates())])
    capsys.readouterr()
    written = json.loads(paths.noise_rates().read_text())
    settings = dict(written["settings"])
    assert settings.pop("guard_numbers") == pytest.approx({"b": 0.2, "c": 0.4, "m": 0.2})
    assert settings == pytest.approx({"value_noise": 0.5, "syntax_noise": 0.0, "operand_share": 0.0, "guard_share": 5 / 6})
    assert written["measured"]["calls_at_risk"] == 12 and written["measured"]["guard_failed"] == 0.5
    rates = student_error_rates(cfg, paths)
    assert rates["value_noise"] == 0.5 and rates["guard_numbers"] == written["settings"]["guard_numbers"]
    chain_task.main(["--out", str(tmp_path / "noisy"), "--train", "8", "--distill", "2", "--checked",
                     "--checked-operand", "--part", "noisy", "--noise-rates", str(paths.noise_rates())])
    summary = json.loads((tmp_path / "noisy" / "noisy_summary.json").read_text())
    assert summary["value_noise"] == 0.5 and summary["guard_numbers"] == written["settings"]["guard_numbers"]


def test_noise_match_with_no_guard_number_misread_weighs_a_alone():
    from experiments.study.noise_match import noise_settings

    measured = {"calls_at_risk": 10, "confused": 0.2, "failed_call": 0.1, "wrong_k_share": None,
                "wrong_guard_share": None, "wrong_guard_numbers": {"several": 1.0}}
    assert noise_settings(measured) == {"value_noise": 0.2, "syntax_noise": 0.1, "operand_share": 0.0,
                                        "guard_share": 0.0, "guard_numbers": {"a": 1.0}}


@pytest.mark.parametrize("episodes,message", [
    ("", "the episodes hold no call, so there is no error rate to match"),
    ('{"call_types": ["wrong_value"], "source": "heldout_prompts.jsonl:9", "turn_texts": ["x"]}\n',
     "an episode is not an evaluation row of these prompts (IndexError)"),
    ('{"call_types": ["correct"]}\n{"oops": 1}\n', "an episode lacks 'call_types'"),
    ("{not json\n", "line 1 is not JSON"),
])
def test_noise_match_names_the_file_of_a_bad_episode(tmp_path, capsys, episodes, message):
    from experiments.study import noise_match

    (tmp_path / "heldout.jsonl").write_text(json.dumps({"expected_calls": []}) + "\n")
    (tmp_path / "episodes.jsonl").write_text(episodes)
    with pytest.raises(SystemExit) as stop:
        noise_match.main(["--heldout", str(tmp_path / "heldout.jsonl"), "--episodes", str(tmp_path / "episodes.jsonl"),
                          "--out", str(tmp_path / "rates.json")])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert stop.value.code == 2 and message in error and str(tmp_path / "episodes.jsonl") in error
    assert not (tmp_path / "rates.json").exists()


def test_misread_number_names_the_input_k_or_the_guard_number(tmp_path):
    from experiments.study.gates import misread_number

    _, paths = _guard_failures(tmp_path)
    expected = json.loads(paths.file("heldout_prompts").read_text())["expected_calls"]
    rows = [json.loads(line) for line in
            (paths.evaluation(0, "student", "t1") / "episodes_student.jsonl").read_text().splitlines()]
    assert [misread_number(row, expected, 0) for row in rows] == [None] * 6 + ["c", "c", "m", "b", "several", "input"]
