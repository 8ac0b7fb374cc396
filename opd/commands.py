"""opd's commands: ``onpolicy-train``, ``onpolicy-sft`` and ``onpolicy-evaluate`` (``python opd/train.py`` etc. in a
checkout). ``--help`` is written from the YAML before the entry is imported (``import torch`` alone takes seconds);
anything else goes on to the entry's Hydra ``main``, with Ctrl-C / SIGTERM ending its start-up (the imports, Hydra
composing the config) in one line and 130 / 143 (``common.start_up``)."""

from __future__ import annotations

from common.entry_help import exit_with_help_if_asked
from common.start_up import run_entry

# entry -> (its config in configs/, the groups whose options live in a folder of another name)
ENTRIES: dict[str, tuple[str, dict[str, str] | None]] = {
    "train": ("opd", {"teacher": "model", "student": "model"}),
    "sft": ("sft", None),
    "evaluate": ("evaluate", None),
}


def run(entry: str) -> None:
    """``opd/{entry}.py``'s command: its ``--help``, else its ``main``, imported here."""
    config, group_folders = ENTRIES[entry]
    exit_with_help_if_asked(config, f"opd/{entry}.py", group_folders)
    run_entry(f"opd.{entry}")


def train() -> None:
    run("train")


def sft() -> None:
    run("sft")


def evaluate() -> None:
    run("evaluate")
