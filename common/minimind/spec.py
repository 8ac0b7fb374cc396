"""What a model config block describes, torch-free: :class:`MiniMindArch` (the architecture flags) and
:class:`ModelSpec` (checkpoint, tokenizer and flags); ``common.minimind.model`` loads them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from common.user_errors import UserError

if TYPE_CHECKING:
    from transformers import Qwen3Config, Qwen3MoeConfig


@dataclass(frozen=True)
class MiniMindArch:
    """The architecture flags of a MiniMind-3 model; everything else follows MiniMind's formulas."""

    hidden_size: int
    num_hidden_layers: int
    use_moe: bool = False
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    num_experts: int = 4
    num_experts_per_tok: int = 1
    vocab_size: int = 6400

    @classmethod
    def from_config(cls, block: Mapping) -> MiniMindArch:
        """Pick the architecture fields out of a teacher/student config block (other keys ignored)."""
        names = {f.name for f in fields(cls)}
        values = {k: block[k] for k in names if k in block and block[k] is not None}
        missing = {"hidden_size", "num_hidden_layers"} - values.keys()
        if missing:
            raise UserError(f"model config lacks {sorted(missing)} (needed to build a native MiniMind checkpoint)")
        return cls(**values)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def intermediate_size(self) -> int:
        return math.ceil(self.hidden_size * math.pi / 64) * 64

    def hf_config(self) -> Qwen3Config | Qwen3MoeConfig:
        """The transformers config that reproduces MiniMind-3 for these flags."""
        from transformers import Qwen3Config, Qwen3MoeConfig

        if self.hidden_size % self.num_attention_heads:
            raise UserError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}"
            )
        common = dict(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            hidden_act="silu",
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_theta=1e6,
            tie_word_embeddings=True,
            attention_bias=False,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        )
        if not self.use_moe:
            return Qwen3Config(**common)
        return Qwen3MoeConfig(
            **common,
            moe_intermediate_size=self.intermediate_size,
            num_experts=self.num_experts,
            num_experts_per_tok=self.num_experts_per_tok,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            router_aux_loss_coef=5e-4,
        )


@dataclass
class ModelSpec:
    """A teacher / student / model config block. ``checkpoint`` is a native MiniMind ``.pth`` (built from the flags,
    loaded strictly) or an HF folder / hub id (flags unused)."""

    checkpoint: str
    name: str = "model"
    tokenizer: str | None = None  # null: the checkpoint's own (HF folders) or the entry's top-level tokenizer
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    use_moe: bool = MiniMindArch.use_moe
    num_attention_heads: int = MiniMindArch.num_attention_heads
    num_key_value_heads: int = MiniMindArch.num_key_value_heads
    num_experts: int = MiniMindArch.num_experts
    num_experts_per_tok: int = MiniMindArch.num_experts_per_tok
    vocab_size: int = MiniMindArch.vocab_size

    @property
    def arch(self) -> MiniMindArch:
        return MiniMindArch.from_config(vars(self))


def is_native_checkpoint(checkpoint: str) -> bool:
    """True for a MiniMind state-dict file (``.pth``/``.pt``, or the same tensors as ``.safetensors``); False for an
    HF model folder or hub id."""
    return str(checkpoint).endswith((".pth", ".pt", ".safetensors"))
