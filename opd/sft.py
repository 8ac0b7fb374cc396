"""Supervised fine-tuning of a MiniMind model on tool-use demonstrations (e.g. to build a teacher).

    python opd/sft.py data=demonstrations.jsonl student@model=full_sft_768
    python opd/sft.py data=demonstrations.jsonl from_scratch=true model.hidden_size=256 model.num_hidden_layers=4
"""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="../configs", config_name="sft")
def main(cfg: DictConfig) -> None:
    from opd.sft_trainer import run

    run(cfg)


if __name__ == "__main__":
    main()
