"""Held-out evaluation of several MiniMind checkpoints on agent prompts with identical decoding and tool limits.

    python opd/evaluate.py data=heldout.jsonl \
        'models={student: {checkpoint: out/full_sft_768.pth, hidden_size: 768, num_hidden_layers: 8}}' \
        +teacher@models.teacher=agent_768
"""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="../configs", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    from opd.evaluation import run

    run(cfg)


if __name__ == "__main__":
    main()
