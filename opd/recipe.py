"""The CPU recipe end to end: data, SFT teacher, weaker student, OPD vs the fixed-data baseline, evaluation.

    python opd/recipe.py tokenizer=PATH            (make recipe)
"""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="../configs", config_name="recipe")
def main(cfg: DictConfig) -> None:
    from opd.cpu_recipe import run

    run(cfg)


if __name__ == "__main__":
    main()
