"""``onpolicy-tiny`` (``make tiny`` in a checkout): everything a first run needs, with nothing to download.

    onpolicy-tiny [--out FOLDER] [--seed N]

Writes into ``tiny_dir()`` (where the ``tiny_*`` presets read) random native MiniMind weights (the same for the same
seed), ``standin-tokenizer/`` and the agent data of ``opd/samples/``; then prints a first run's commands.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from common.package_files import CONFIG_DIR, package_data, tiny_dir
from common.start_up import run_entry
from common.user_errors import UserError

STANDIN_TOKENIZER = "standin-tokenizer"
SAMPLES = ("tool_prompts.jsonl", "tool_heldout.jsonl", "tool_demonstrations.jsonl")


def tiny_arch(role: str):
    """The architecture of the ``tiny_{role}`` preset (role: teacher or student)."""
    from omegaconf import OmegaConf

    from common.minimind.spec import MiniMindArch

    return MiniMindArch.from_config(OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "model" / f"tiny_{role}.yaml")))


def write_tiny_checkpoints(out_dir: str | Path, seed: int = 0) -> dict[str, Path]:
    """Write ``tiny_teacher.pth`` and ``tiny_student.pth`` into ``out_dir``; returns their paths."""
    import torch

    from common.minimind.model import build_model, save_native

    written = {}
    for offset, role in enumerate(("teacher", "student")):
        torch.manual_seed(seed + offset)
        written[role] = save_native(build_model(tiny_arch(role)), Path(out_dir) / f"tiny_{role}.pth")
    return written


def first_run_commands(folder: Path) -> list[str]:
    """The commands of a first run on what ``onpolicy-tiny`` wrote to ``folder`` (outputs under ``./tiny-run/``)."""
    data = {name: str(folder / name) for name in SAMPLES}
    return [
        "onpolicy-regen dataset=sample server=local max_tokens=48 output=tiny-run/regen.jsonl",
        f"onpolicy-train teacher=tiny_teacher student=tiny_student data={data['tool_prompts.jsonl']} batch_size=4 "
        "rollout.max_gen_len=64 max_steps=2 out_dir=tiny-run/opd",
        f"onpolicy-evaluate data={data['tool_heldout.jsonl']} rollout.max_gen_len=64 +model@models.before=tiny_student "
        "+model@models.after=tiny_student models.after.checkpoint=tiny-run/opd/agent_opd_64.pth out_dir=tiny-run/eval",
    ]


def write_first_run(folder: Path, seed: int) -> None:
    """Everything the module doc lists, into ``folder``."""
    from common.minimind.standin_tokenizer import build_standin_tokenizer

    try:
        folder.mkdir(parents=True, exist_ok=True)
        for role, path in write_tiny_checkpoints(folder, seed).items():
            print(f"{role}: {path}")
        print(f"stand-in tokenizer: {build_standin_tokenizer(folder / STANDIN_TOKENIZER)}")
        for name in SAMPLES:
            print(f"agent data: {shutil.copyfile(package_data(f'opd/samples/{name}'), folder / name)}")
    except OSError as error:
        raise UserError(f"cannot write the tiny files to {folder} ({error.strerror or error})",
                        "choose another folder with --out (or $ONPOLICY_TINY_DIR)") from None
    print("\nA first run, from any folder (seconds to a minute each on a CPU):")
    for command in first_run_commands(folder):
        print(f"  {command}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="onpolicy-tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=tiny_dir(),
                        help="folder to write to (default: where the tiny presets look, %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: %(default)s)")
    args = parser.parse_args()
    write_first_run(args.out.expanduser().absolute(), args.seed)


def command() -> None:
    """The console script: ``main`` with its errors and Ctrl-C as one line."""
    run_entry("common.minimind.tiny")


if __name__ == "__main__":
    command()
