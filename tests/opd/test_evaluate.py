"""opd/evaluate.py: deterministic per seed, k samples per prompt whose episodes depend on neither batches, order nor
other records, held-out checks before any rollout, and the CLI end to end (two checkpoints, each in its own process,
the table, the JSON report and the chart; k samples at temperature 1 in-process)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from common.chat_records import RecordError, load_agent_records
from common.config_schema import ConfigError
from common.minimind.spec import ModelSpec
from common.minimind.tiny import tiny_arch
from common.minimind.tokenizer import load_tokenizer
from experiments.recipe.synthetic_task import write_task
from opd.config import EvalConfig, LoggerConfig, RolloutConfig, SamplingConfig, WandbConfig
from opd.evaluate import check_heldout, evaluate, evaluate_checkpoint
from opd.rollouts.sampling import prompt_key
from tests.helpers.configs import entry_config
from tests.helpers.opd_support import agent_record, model_override, not_a_checkpoint, run_entry


def test_evaluate_cli_compares_checkpoints(tmp_path, tokenizer_path, tiny_checkpoints):
    checkpoints = tiny_checkpoints
    data = write_task(tmp_path / "task", train=5, heldout=4, seed=4)["files"]["heldout_prompts"]
    out = tmp_path / "eval"
    result = run_entry("evaluate", f"data={data}", f"tokenizer={tokenizer_path}", f"out_dir={out}",
                       f"hydra.run.dir={tmp_path / 'run'}", "rollout.max_gen_len=8", "rollout.max_turns=2", "batch_size=2",
                       "device=cpu", model_override("small", checkpoints["student"], "student"),
                       model_override("large", checkpoints["teacher"], "teacher"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "evaluation.json").read_text())
    assert [c["name"] for c in report["checkpoints"]] == ["small", "large"]
    assert report["records"] == 4 and report["settings"]["sampling"]["temperature"] == 0.0
    assert report["settings"]["isolate"] is True
    for checkpoint in report["checkpoints"]:
        assert checkpoint["episodes"] == 4 and 0.0 <= checkpoint["accuracy"] <= 1.0
        assert checkpoint["peak_memory_kind"] == "process_peak_rss"
        assert checkpoint["peak_memory_mb"] >= checkpoint["baseline_rss_mb"] > 0
        assert checkpoint["mean_assistant_tokens"] > 0 and checkpoint["wall_s"] > 0
        assert len((out / f"episodes_{checkpoint['name']}.jsonl").read_text().splitlines()) == 4
    assert (out / "evaluation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "evaluation" in result.stdout and "small" in result.stdout and "large" in result.stdout


def test_evaluate_cli_a_checkpoint_that_is_no_checkpoint_is_one_error_line(tmp_path, tokenizer_path):
    """The data file as a model's checkpoint, loaded in the checkpoint's own process (isolate=true)."""
    data = write_task(tmp_path / "task", train=5, heldout=2, seed=4)["files"]["heldout_prompts"]
    result = run_entry("evaluate", f"data={data}", f"tokenizer={tokenizer_path}", f"out_dir={tmp_path / 'eval'}",
                       f"hydra.run.dir={tmp_path / 'run'}", "device=cpu", "chart=false",
                       model_override("small", data, "student"))
    assert result.returncode == 1 and result.stderr.splitlines() == [
        not_a_checkpoint("models.small.checkpoint", data)], result.stderr[-3000:]


def test_evaluate_cli_refuses_an_empty_model_list(tmp_path, tokenizer_path):
    result = run_entry("evaluate", "data=x.jsonl", "models={}", f"hydra.run.dir={tmp_path / 'run'}")
    assert result.returncode == 1, result.stderr
    assert "error: models must be a mapping of name -> model block" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def heldout(tmp_path_factory, tiny_checkpoints):
    root = tmp_path_factory.mktemp("eval")
    checkpoints = tiny_checkpoints
    files = write_task(root / "task", train=5, heldout=5, seed=2)["files"]
    return root, checkpoints, files["heldout_prompts"]


def settings(models: dict[str, ModelSpec], data, out_dir, *, temperature: float = 0.0, seed: int = 0, samples: int = 1,
             batch_size: int = 2) -> EvalConfig:
    return EvalConfig(SamplingConfig(temperature=temperature), RolloutConfig(2, 12, 2048, open_thinking=False), models,
                      tokenizer=None, data=str(data), out_dir=str(out_dir), device="cpu", dtype="float32", seed=seed,
                      samples_per_prompt=samples, batch_size=batch_size, isolate=False, chart=False,
                      logger=LoggerConfig(["jsonl"], WandbConfig("opd", None, "offline")), log_step=0)


def block(checkpoint, tokenizer_path) -> ModelSpec:
    return ModelSpec(checkpoint=str(checkpoint), tokenizer=str(tokenizer_path), **vars(tiny_arch("student")))


def test_evaluation_is_deterministic_for_a_fixed_seed(heldout, tokenizer_path):
    root, checkpoints, data = heldout
    model = block(checkpoints["student"], tokenizer_path)
    runs = {name: evaluate_checkpoint("student", model, settings({"student": model}, data, root / name,
                                                                 temperature=1.0, seed=seed, samples=2))
            for name, seed in (("a", 7), ("b", 7), ("c", 8))}
    episodes = {name: (root / name / "episodes_student.jsonl").read_text() for name in runs}
    assert episodes["a"] == episodes["b"] != episodes["c"]
    timing = ("load_s", "wall_s", "assistant_tokens_per_s", "baseline_rss_mb")
    assert {k: v for k, v in runs["a"].items() if k not in timing} == {k: v for k, v in runs["b"].items() if k not in timing}
    assert (runs["a"]["episodes"], runs["a"]["prompts"]) == (10, 5)
    assert runs["a"]["peak_memory_mb"] is None  # cpu, not isolated: not measured


def episodes_by_prompt(out_dir, data) -> dict:
    """(prompt key, sample) -> what the episode did, from an evaluation's episodes file."""
    keys = {record.source: prompt_key(record) for record in load_agent_records(data)[0]}
    rows = [json.loads(line) for line in (out_dir / "episodes_student.jsonl").read_text().splitlines()]
    return {(keys[row["source"]], row["sample"]): (row["turn_texts"], row["correct"], row["call_types"]) for row in rows}


def test_each_sample_depends_on_its_prompt_and_index_only(heldout, tokenizer_path, tmp_path):
    """The same (prompt, sample) episodes with other batch sizes, the records reversed, and other records added."""
    _, checkpoints, data = heldout
    lines = Path(data).read_text().splitlines(keepends=True)
    others = write_task(tmp_path / "other", train=5, heldout=3, seed=9)["files"]["heldout_prompts"]
    variants = {"reversed.jsonl": lines[::-1], "more.jsonl": [*Path(others).read_text().splitlines(keepends=True), *lines]}
    for name, content in variants.items():
        (tmp_path / name).write_text("".join(content))
    model = block(checkpoints["student"], tokenizer_path)
    runs = {}
    for name, path, batch_size in (("base", data, 2), ("one", data, 1), ("reversed", tmp_path / "reversed.jsonl", 3),
                                   ("more", tmp_path / "more.jsonl", 4)):
        evaluate_checkpoint("student", model, settings({"student": model}, path, tmp_path / name, temperature=1.0,
                                                        seed=3, samples=3, batch_size=batch_size))
        runs[name] = episodes_by_prompt(tmp_path / name, path)
    assert len(runs["base"]) == 15 and {sample for _, sample in runs["base"]} == {0, 1, 2}
    assert runs["one"] == runs["base"] and runs["reversed"] == runs["base"]
    assert {key: runs["more"][key] for key in runs["base"]} == runs["base"] and len(runs["more"]) == 24
    texts = [turns for turns, _, _ in runs["base"].values()]
    assert len({json.dumps(turns) for turns in texts}) > 5  # the samples of a prompt differ from each other


def test_evaluate_entry_samples_k_episodes_per_prompt_at_temperature_one(heldout, tokenizer_path, tmp_path):
    """``samples_per_prompt=4 sampling=opd_rollout`` as composed from the command line, run in-process."""
    _, checkpoints, data = heldout
    arguments = [f"data={data}", f"tokenizer={tokenizer_path}", f"out_dir={tmp_path / 'eval'}", "device=cpu",
                 "isolate=false", "samples_per_prompt=4", "sampling=opd_rollout", "rollout.max_gen_len=8",
                 "rollout.max_turns=2", "batch_size=3", model_override("small", checkpoints["student"], "student")]
    report = evaluate(entry_config("evaluate", arguments))
    again = evaluate(entry_config("evaluate", [*arguments[:2], f"out_dir={tmp_path / 'again'}", *arguments[3:]]))
    assert report["settings"]["samples_per_prompt"] == 4 and report["settings"]["sampling"]["temperature"] == 1.0
    result = report["checkpoints"][0]
    assert (result["episodes"], result["prompts"]) == (20, 5) and result["accuracy_se"] is not None
    assert sum(result["call_types"].values()) == result["tool_calls"]
    timing = ("load_s", "wall_s", "assistant_tokens_per_s", "baseline_rss_mb")
    assert {k: v for k, v in result.items() if k not in timing} == {
        k: v for k, v in again["checkpoints"][0].items() if k not in timing}  # the same command, the same numbers
    rows = [json.loads(line) for line in (tmp_path / "eval" / "episodes_small.jsonl").read_text().splitlines()]
    assert [(row["source"].rsplit(":", 1)[1], row["sample"]) for row in rows] == [
        (str(line), sample) for line in range(1, 6) for sample in range(4)]
    assert (tmp_path / "eval" / "evaluation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("overrides,message", [
    (["samples_per_prompt=0"], "samples_per_prompt must be an integer >= 1, got 0"),
    (["samples_per_prompt=2"], "samples_per_prompt must be 1 with greedy decoding (sampling.temperature=0"),
])
def test_bad_samples_per_prompt_is_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as refused:
        entry_config("evaluate", ["data=x.jsonl", "models={m: {checkpoint: x.pth}}", *overrides])
    assert message in str(refused.value)


RECORDS = [replace(agent_record("h.jsonl:1", "What is 2+3?"), gt=["5"]), agent_record("h.jsonl:2", "And 3+4?")]


def test_heldout_records_need_gt(heldout, tokenizer_path):
    _, checkpoints, _ = heldout
    blocks = {"student": block(checkpoints["student"], tokenizer_path)}
    with pytest.raises(RecordError, match="h.jsonl:2: gt is required for evaluation"):
        check_heldout(RECORDS, settings(blocks, "-", "-"))
    check_heldout(RECORDS[:1], settings(blocks, "-", "-"))


def test_models_must_share_one_tokenizer(heldout, tokenizer_path, tmp_path):
    _, checkpoints, _ = heldout
    other = load_tokenizer(str(tokenizer_path))
    other.add_tokens(["<extra_token>"])
    other.save_pretrained(tmp_path / "other-tokenizer")
    blocks = {"student": block(checkpoints["student"], tokenizer_path),
              "other": block(checkpoints["student"], tmp_path / "other-tokenizer")}
    with pytest.raises(ValueError, match="student and other tokenizers differ"):
        check_heldout(RECORDS[:1], settings(blocks, "-", "-"))


def test_minimind_agent_rl_rows_roll_out_and_evaluate(tmp_path, tokenizer, tokenizer_path, tiny_checkpoints):
    """MiniMind-shaped agent_rl rows: observations from its tool world, its answer check, the evaluate entry."""
    from opd.episodes.chat_format import ChatFormat
    from opd.episodes.scoring import score_episode
    from opd.rollouts.rollout import AgentRollout
    from standins.scripted_sampler import ScriptedSampler
    from tests.helpers.opd_support import MINIMIND_ROWS, call_text, encode, tiny_model

    data = tmp_path / "agent_rl.jsonl"
    data.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in MINIMIND_ROWS), encoding="utf-8")
    records, _ = load_agent_records(data)
    eos = [tokenizer.eos_token_id]
    scripts = {
        records[0].source: [encode(tokenizer, call_text("get_current_weather", location="北京")) + eos,
                            encode(tokenizer, "北京现在28°C，晴。") + eos],
        records[1].source: [encode(tokenizer, call_text("get_exchange_rate", from_currency="USD", to_currency="CNY")) + eos,
                            encode(tokenizer, call_text("calculate_math", expression="100*7.21")) + eos,
                            encode(tokenizer, "100美元约合721元人民币。") + eos],
    }
    chat_format = ChatFormat(tokenizer)
    episodes = AgentRollout(tiny_model(), chat_format, ScriptedSampler(scripts),
                            RolloutConfig(3, 96, 2048, open_thinking=False)).run(records)
    observations = [chat_format.decode(e.ids[t.end:t.observation_end]) for e in episodes for t in e.turns
                    if t.observation_end]
    assert '{"from": "USD", "to": "CNY", "rate": 7.21}' in observations[1] and '{"result": "721.0"}' in observations[2]
    assert [score_episode(e, chat_format).correct for e in episodes] == [True, True]
    checkpoints = tiny_checkpoints
    report = evaluate(settings({"student": block(checkpoints["student"], tokenizer_path)}, data, tmp_path / "eval"))
    assert report["records"] == 2 and report["checkpoints"][0]["episodes"] == 2
