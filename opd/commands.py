"""opd's commands: ``onpolicy-train``, ``onpolicy-sft`` and ``onpolicy-evaluate`` (``python opd/train.py`` etc.).
The config is composed and checked before torch is imported, so a typo is refused at once; start-up signals end in
one line (130 / 143)."""

from __future__ import annotations

import importlib

from common.entry_help import exit_with_help_if_asked
from common.hydra_errors import composition_errors_as_user_errors
from common.package_files import CONFIG_DIR
from common.start_up import start_up_interrupts, stop_at_start_up
from common.user_errors import exit_on_user_error

# entry -> (its config in configs/, its schema in opd.config, the function of opd.{entry} that runs a checked config,
# the groups whose options live in a folder of another name)
ENTRIES: dict[str, tuple[str, str, str, dict[str, str] | None]] = {
    "train": ("opd", "OPDConfig", "train", {"teacher": "model", "student": "model"}),
    "sft": ("sft", "SFTConfig", "train", None),
    "evaluate": ("evaluate", "EvalConfig", "evaluate", None),
}


def run(entry: str) -> None:
    """``opd/{entry}.py``'s command: its ``--help``, else its config composed and checked, then its work."""
    config, schema, work, group_folders = ENTRIES[entry]
    exit_with_help_if_asked(config, f"opd/{entry}.py", group_folders)
    stop_at_start_up()
    with exit_on_user_error(), start_up_interrupts(), composition_errors_as_user_errors():
        import hydra

        from opd import config as schemas
        from opd.training.out_dir import checked_run

        schemas.register_model_groups()

        def job(cfg) -> None:
            checked_run(getattr(schemas, schema), cfg,
                        lambda settings: getattr(importlib.import_module(f"opd.{entry}"), work)(settings))

        hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name=config)(job)()


def train() -> None:
    run("train")


def sft() -> None:
    run("sft")


def evaluate() -> None:
    run("evaluate")
