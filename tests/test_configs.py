"""The Hydra config tree: every option of every group composes for both entrypoints, and the CLIs print it."""

from __future__ import annotations

import dataclasses
import importlib
from functools import partial

import pytest
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from common.minimind.spec import ModelSpec
from opd import commands
from tests.helpers.configs import compose_config, entry_config, options
from tests.helpers.entries import run_main
from tests.helpers.paths import CONFIG_DIR, REPO_ROOT

GROUPS = {
    "regen": ("dataset", "server", "sampling"),
    "opd": ("teacher", "student", "sampling"),
    "sft": ("model",),
    "evaluate": ("sampling",),
}
# Mandatory (???) values a user must give, per entrypoint and group option.
REQUIRED = {  # a native MiniMind checkpoint needs a tokenizer (it holds none)
    "regen": ["dataset=sample"],
    "opd": ["data=agent.jsonl", "tokenizer=tok"],
    "sft": ["data=demonstrations.jsonl", "tokenizer=tok"],
    "evaluate": ["data=heldout.jsonl", "+model@models.teacher=agent_768", "tokenizer=tok"],
}


@pytest.mark.parametrize(
    "config_name,group,option",
    [(name, group, option) for name, groups in GROUPS.items() for group in groups for option in options(group)],
)
def test_every_group_option_composes(config_name, group, option):
    overrides = [o for o in REQUIRED[config_name] if not o.startswith(f"{group}=")] + [f"{group}={option}"]
    cfg = compose_config(config_name, overrides, hydra_config=True)
    block = OmegaConf.to_container(cfg[group], resolve=True, throw_on_missing=False)
    reference = OmegaConf.to_container(
        compose_config(config_name, REQUIRED[config_name], hydra_config=True)[group], resolve=True, throw_on_missing=False
    )
    if group != "server":  # every preset of a group has the same keys, so overrides work on any of them
        assert set(block) == set(reference), f"{group}={option} keys differ from the default preset"
    assert OmegaConf.is_struct(cfg), "unknown keys must fail"
    if config_name != "regen":  # every preset fills the entry's typed schema
        entry_config(config_name, overrides)


def test_no_config_file_is_a_byte_identical_twin_of_another():
    contents: dict[bytes, str] = {}
    for path in sorted(CONFIG_DIR.rglob("*.yaml")):
        twin = contents.setdefault(path.read_bytes(), str(path.relative_to(CONFIG_DIR)))
        assert twin == str(path.relative_to(CONFIG_DIR)), f"{path.relative_to(CONFIG_DIR)} repeats {twin}"


@pytest.mark.parametrize("preset", options("model"))
def test_one_model_preset_serves_every_entry(preset):
    """The same file is opd's teacher, opd's student, sft's model, an evaluate model and the local server's model."""
    preset_file = OmegaConf.load(CONFIG_DIR / "model" / f"{preset}.yaml")  # its own resolvers resolve alone
    reference = {key: preset_file[key] for key in preset_file if key != "tokenizer"}  # ${tokenizer}: the entry's
    seen = [compose_config("opd", ["data=x", f"teacher={preset}"], hydra_config=True).teacher,
            compose_config("opd", ["data=x", f"student={preset}"], hydra_config=True).student,
            compose_config("sft", ["data=x", f"model={preset}"], hydra_config=True).model,
            compose_config("evaluate", ["data=x", f"+model@models.m={preset}"], hydra_config=True).models.m,
            compose_config("regen", ["dataset=sample", "server=local", f"model@server={preset}"], hydra_config=True).server]
    for block in seen:
        assert {key: block[key] for key in reference} == reference


def test_group_key_sets():
    for option in options("model"):
        block = OmegaConf.load(CONFIG_DIR / "model" / f"{option}.yaml")
        assert {"name", "checkpoint", "hidden_size", "num_hidden_layers", "tokenizer"} <= set(block)
        assert set(block) <= {field.name for field in dataclasses.fields(ModelSpec)}
    for option in options("sampling"):
        block = OmegaConf.load(CONFIG_DIR / "sampling" / f"{option}.yaml")
        assert set(block) == set(OmegaConf.load(CONFIG_DIR / "sampling" / "server_default.yaml"))
    assert all(v is None for v in OmegaConf.load(CONFIG_DIR / "sampling" / "server_default.yaml").values())
    opd = OmegaConf.load(CONFIG_DIR / "sampling" / "opd_rollout.yaml")
    assert (opd.temperature, opd.top_p, opd.top_k) == (1.0, 1.0, 0)


def test_every_dataset_preset_has_one_name_speculators_spelling():
    """One file per preset, named as its ``name`` (what outputs and manifests record): speculators' spelling."""
    presets = options("dataset")
    assert {"open-perfectblend", "hermes-fc", "sharegpt4v-coco"} <= set(presets)
    assert not {name.replace("-", "_") for name in presets if "-" in name} & set(presets)  # no second spelling
    for option in presets:
        assert OmegaConf.load(CONFIG_DIR / "dataset" / f"{option}.yaml").name in (option, None)


def test_model_presets_follow_minimind_naming():
    for option in options("model"):
        block = OmegaConf.load(CONFIG_DIR / "model" / f"{option}.yaml")
        assert block.name == option
        if not option.startswith("tiny"):
            suffix = "_moe" if block.use_moe else ""
            assert block.checkpoint == f"out/{option}.pth" and option.endswith(f"_{block.hidden_size}{suffix}")


def test_unknown_key_and_missing_required_value_fail():
    with pytest.raises(ConfigCompositionException):
        compose_config("regen", ["dataset=sample", "no_such_key=1"], hydra_config=True)
    with pytest.raises(ConfigCompositionException):
        compose_config("regen", ["dataset=no_such_preset"], hydra_config=True)
    cfg = compose_config("regen", ["dataset=magpie"], hydra_config=True)
    assert OmegaConf.is_missing(cfg.server, "model")


def test_multirun_job_dirs_never_collide():
    for name in GROUPS:
        cfg = compose_config(name, REQUIRED[name], hydra_config=True)
        assert "${hydra.job.num}" in OmegaConf.to_container(cfg.hydra.sweep)["subdir"]


def run_cli(script: str, *overrides: str) -> dict:
    """``python SCRIPT --cfg job OVERRIDES`` (inside this process): the composed config it prints."""
    if script.startswith("opd/"):  # opd's scripts hand over to their command (opd.commands), which composes
        main = partial(commands.run, script.removeprefix("opd/").removesuffix(".py"))
    else:
        main = importlib.import_module(script.removesuffix(".py").replace("/", ".")).main
    result = run_main(main, "--cfg", "job", *overrides, cwd=REPO_ROOT, program=script)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_regen_cli_prints_composed_config():
    cfg = run_cli("regen/main.py", "dataset=magpie", "server.dp=4")
    assert cfg["dataset"]["path"] == "Magpie-Align/Magpie-Llama-3.1-Pro-300K-Filtered"
    assert cfg["server"]["kind"] == "vllm" and cfg["server"]["dp"] == 4 and cfg["server"]["model"] == "???"
    assert cfg["sampling"]["temperature"] is None


def test_opd_cli_prints_composed_config():
    cfg = run_cli("opd/train.py", "teacher=agent_768")
    assert cfg["teacher"]["checkpoint"] == "out/agent_768.pth" and cfg["teacher"]["hidden_size"] == 768
    assert cfg["student"]["name"] == "full_sft_768"
    assert (cfg["sampling"]["temperature"], cfg["sampling"]["top_k"]) == (1.0, 0)
