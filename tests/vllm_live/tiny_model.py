"""Write a tiny random-init Qwen3-shaped model folder that ``vllm serve`` loads, with the MiniMind-3 tokenizer.

    python tests/vllm_live/tiny_model.py OUT_DIR TOKENIZER_DIR

Run with the vLLM venv's python (its transformers writes the config vLLM reads). Shapes: 2 layers, hidden 128,
2 heads of 64 (vLLM's CPU attention wants a common head size), 1 KV head, MiniMind-3's vocabulary of 6400
and its special ids; float32 weights from a fixed seed, so every run serves the same model.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def write_tiny_model(out_dir: Path, tokenizer_dir: Path) -> None:
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=6400, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
                         rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0, torch_dtype="float32")
    model = Qwen3ForCausalLM(config).to(torch.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / name, out_dir / name)


if __name__ == "__main__":
    write_tiny_model(Path(sys.argv[1]), Path(sys.argv[2]))
