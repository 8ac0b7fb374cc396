"""Regenerate every assistant turn of a chat dataset with a served model.

    python regen/main.py dataset=magpie server.model=Qwen/Qwen3-8B server.dp=4

The job is ``regen.job.run``. A mistake a person can fix ends in one or two ``error:`` lines and exit status 1
(``HYDRA_FULL_ERROR=1`` shows the traceback too); Ctrl-C / SIGTERM end with status 130 / 143.
"""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="../configs", config_name="regen")
def main(cfg: DictConfig) -> None:
    from common.user_errors import exit_on_user_error
    from regen.job import run

    with exit_on_user_error():
        run(cfg)


if __name__ == "__main__":
    main()
