"""Regenerate every assistant turn of a chat dataset with a served model.

    python regen/main.py dataset=magpie server.model=Qwen/Qwen3-8B server.dp=4
"""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="../configs", config_name="regen")
def main(cfg: DictConfig) -> None:
    from regen.job import run

    run(cfg)


if __name__ == "__main__":
    main()
