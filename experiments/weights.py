"""A native MiniMind checkpoint copied into the ``.safetensors`` file a run folder keeps, in its own dtypes, and read
back to check it (``read_native_state_dict`` of the copy equals the source's tensors):

    python -m experiments.weights SOURCE.pth TARGET.safetensors
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from common.minimind.model import read_native_state_dict, save_native_safetensors
from common.user_errors import exit_on_user_error


def copy_weights(source: Path, target: Path) -> dict[str, torch.Tensor]:
    """Write ``source``'s tensors to ``target``, then check the copy (removed if it differs)."""
    state = read_native_state_dict(source)
    save_native_safetensors(state, target)
    copy = read_native_state_dict(target)
    differ = sorted(key for key in state.keys() | copy.keys()
                    if key not in state or key not in copy or not torch.equal(state[key], copy[key]))
    if differ:
        target.unlink()
        raise RuntimeError(f"{target} read back differs from {source} in {differ[:3]}; removed it")
    return state


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    with exit_on_user_error():
        state = copy_weights(args.source, args.target)
    dtypes = sorted({str(tensor.dtype).removeprefix("torch.") for tensor in state.values()})
    print(f"wrote {args.target} ({len(state)} tensors, {', '.join(dtypes)}), read back equal")


if __name__ == "__main__":
    main()
