"""Configs composed from ``configs/`` as the command line would compose them."""

from __future__ import annotations

from functools import cache

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from common.config_schema import parse_config
from opd.config import EvalConfig, OPDConfig, SFTConfig, register_model_groups
from tests.helpers.paths import CONFIG_DIR

SCHEMAS = {"opd": OPDConfig, "sft": SFTConfig, "evaluate": EvalConfig}
# Hydra's config store outlives each composition: the presets are stored once per process (a third of a
# composition's time when stored every time).
store_model_groups = cache(register_model_groups)


def compose_config(config_name: str, overrides: list[str], *, hydra_config: bool = False):
    """A config from ``configs/`` composed as the CLI would (fresh Hydra state each time); ``hydra_config`` keeps
    the ``hydra`` node (run and sweep folders)."""
    store_model_groups()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=config_name, overrides=overrides, return_hydra_config=hydra_config)


def entry_config(config_name: str, overrides: list[str]):
    """The typed settings an entry runs with: composed as the CLI would, then parsed and checked."""
    return parse_config(SCHEMAS[config_name], compose_config(config_name, overrides))


def options(group: str) -> list[str]:
    folder = "model" if group in ("teacher", "student") else group  # opd's teacher/student groups are configs/model/
    return sorted(p.stem for p in (CONFIG_DIR / folder).glob("*.yaml"))
