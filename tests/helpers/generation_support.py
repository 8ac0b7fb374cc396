"""What the generation engine's tests and the embedded server's share: a small random MiniMind-shaped model and
random prompts of given lengths."""

from __future__ import annotations

import torch

from common.minimind.model import MiniMindArch, build_model


def small_random_model(seed: int = 0) -> torch.nn.Module:
    """A random-init MiniMind-shaped Qwen3 (64 wide, 2 layers, 4 heads, 2 KV heads), in eval mode."""
    torch.manual_seed(seed)
    return build_model(MiniMindArch(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2)).eval()


def random_prompts(lengths: tuple[int, ...], seed: int = 1) -> list[list[int]]:
    """One prompt of random ids (3 and above: no pad, BOS or EOS) per length."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 6400, (n,), generator=generator).tolist() for n in lengths]
