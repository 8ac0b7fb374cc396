"""``onpolicy-export-hf``: a native MiniMind ``.pth`` and its tokenizer as an HF Qwen3 folder that ``vllm serve`` loads.

    onpolicy-export-hf --model agent_768 --checkpoint out/agent_768.pth --tokenizer TOKENIZER --out out/agent_768-hf

The architecture is a ``configs/model/`` preset. Weights are safetensors in ``--dtype`` (float16: MiniMind's own, so
nothing is rounded). The folder appears whole or not at all (written beside it, then renamed).
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from common.package_files import CONFIG_DIR, register_resolvers
from common.start_up import run_entry
from common.user_errors import UserError

DTYPES = ("float16", "bfloat16", "float32")


def preset_spec(name: str, checkpoint: str | None, tokenizer: str | None):
    """The ``ModelSpec`` of preset ``name`` with ``checkpoint`` / ``tokenizer`` set (the preset's own when None)."""
    from omegaconf import OmegaConf

    from common.minimind.spec import ModelSpec

    path = CONFIG_DIR / "model" / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
        raise UserError(f"--model {name}: no such preset (one of: {', '.join(names)})")
    register_resolvers()
    block = OmegaConf.merge({"tokenizer": tokenizer}, {"preset": OmegaConf.load(path)})
    if checkpoint is not None:
        block.preset.checkpoint = checkpoint
    if tokenizer is not None:
        block.preset.tokenizer = tokenizer
    values = OmegaConf.to_container(block.preset, resolve=True)
    return ModelSpec(**{key: value for key, value in values.items() if key in ModelSpec.__dataclass_fields__})


def export(spec, out: Path, *, dtype: str = "float16", overwrite: bool = False) -> Path:
    """Write ``spec``'s native checkpoint and tokenizer to ``out`` as an HF folder; returns ``out``."""
    import torch

    from common.minimind.model import load_model
    from common.minimind.spec import is_native_checkpoint

    if not is_native_checkpoint(spec.checkpoint):
        raise UserError(f"--checkpoint {spec.checkpoint} is not a native MiniMind .pth: an HF folder needs no export")
    out = Path(out).expanduser().resolve()
    if out.exists() and not overwrite:
        raise UserError(f"--out {out} exists", "choose another folder, or add --overwrite to replace it")
    if out.exists():  # --overwrite replaces an earlier export only, never a folder holding this run or its inputs
        inside = [str(path) for path in (Path.cwd(), Path(spec.checkpoint), Path(spec.tokenizer or out))
                  if path.expanduser().resolve().is_relative_to(out) and path.expanduser().resolve() != out]
        if not out.is_dir() or not (out / "config.json").is_file() or inside or Path.cwd().resolve() == out:
            raise UserError(f"--out {out} is not an HF model folder this command wrote (no config.json), or it holds "
                            f"the working folder or an input{f' ({inside[0]})' if inside else ''}; --overwrite "
                            "replaces only an earlier export", "choose another --out")
    model, tokenizer = load_model(spec, role="model")
    model.to(getattr(torch, dtype))
    staging = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        aside = out.with_name(f".{out.name}.replaced-{os.getpid()}")
        if out.exists():  # the earlier export goes only once the new one is complete, by renames
            out.rename(aside)
        staging.rename(out)
        shutil.rmtree(aside, ignore_errors=True)
    except OSError as error:
        raise UserError(f"cannot write {out} ({error.strerror or error})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="onpolicy-export-hf", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the preset of configs/model/ that describes the architecture")
    parser.add_argument("--checkpoint", help="the native .pth (default: the preset's)")
    parser.add_argument("--tokenizer", help="the tokenizer folder (default: the preset's; MiniMind-3's for real "
                        "checkpoints)")
    parser.add_argument("--out", required=True, type=Path, help="the HF folder to write")
    parser.add_argument("--dtype", choices=DTYPES, default="float16", help="weights' dtype (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    args = parser.parse_args()
    spec = preset_spec(args.model, args.checkpoint, args.tokenizer)
    print(f"wrote {export(spec, args.out, dtype=args.dtype, overwrite=args.overwrite)}")


def command() -> None:
    """The console script: ``main`` with its errors as ``error:`` lines."""
    run_entry("common.minimind.hf_export")


if __name__ == "__main__":
    command()
