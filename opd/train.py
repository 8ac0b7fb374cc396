"""On-policy distillation of a MiniMind student from a frozen MiniMind teacher over tool-use episodes.

    python opd/train.py teacher=agent_768 student=full_sft_768 data=dataset/agent_rl.jsonl
"""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="../configs", config_name="opd")
def main(cfg: DictConfig) -> None:
    from opd.trainer import run

    run(cfg)


if __name__ == "__main__":
    main()
