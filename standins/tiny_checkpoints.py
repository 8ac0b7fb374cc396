"""Write random-init tiny teacher/student checkpoints in native MiniMind format (for tests and the demo).

    python -m standins.tiny_checkpoints [--out FOLDER] [--standin-tokenizer out/tiny/standin-tokenizer]

The architectures come from configs/model/tiny_teacher.yaml and tiny_student.yaml, so the files always
match those presets; by default they go where those presets look (``common.package_files.tiny_dir``:
``$ONPOLICY_TINY_DIR``, else ``out/tiny`` in the checkout). Seeds are fixed: the same command writes the same
weights.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from omegaconf import OmegaConf

from common.minimind.model import build_model, save_native
from common.minimind.spec import MiniMindArch
from common.package_files import CONFIG_DIR, tiny_dir
from standins.tokenizer import build_standin_tokenizer


def tiny_arch(role: str) -> MiniMindArch:
    """The architecture of the ``tiny_{role}`` preset (role: teacher or student)."""
    return MiniMindArch.from_config(OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "model" / f"tiny_{role}.yaml")))


def write_tiny_checkpoints(out_dir: str | Path, seed: int = 0) -> dict[str, Path]:
    """Write ``tiny_teacher.pth`` and ``tiny_student.pth`` into ``out_dir``; returns their paths."""
    written = {}
    for offset, role in enumerate(("teacher", "student")):
        torch.manual_seed(seed + offset)
        model = build_model(tiny_arch(role))
        written[role] = save_native(model, Path(out_dir) / f"tiny_{role}.pth")
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(tiny_dir()),
                        help="folder for tiny_teacher.pth / tiny_student.pth (default: the tiny presets' folder, %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--standin-tokenizer", default=None,
                        help="also write the MiniMind-shaped stand-in tokenizer to this folder")
    args = parser.parse_args(argv)
    for role, path in write_tiny_checkpoints(args.out, args.seed).items():
        print(f"{role}: {path}")
    if args.standin_tokenizer:
        print(f"stand-in tokenizer: {build_standin_tokenizer(args.standin_tokenizer)}")


if __name__ == "__main__":
    main()
