"""Regenerate every assistant turn of a chat dataset with a served model.

    python regen/main.py dataset=magpie server.model=Qwen/Qwen3-8B server.dp=4
    onpolicy-regen dataset=magpie server.model=Qwen/Qwen3-8B server.dp=4     # the same, installed

The job is ``regen.job.run``. A fixable mistake ends in ``error:`` lines and status 1 (``HYDRA_FULL_ERROR=1`` adds
the traceback); Ctrl-C / SIGTERM end with 130 / 143 from the first line of this file on.
"""

try:
    from common.entry_help import exit_with_help_if_asked
except ModuleNotFoundError:  # the script, by a Python without the project (not the venv's): one line, no traceback
    raise SystemExit("error: this Python has no onpolicy-research: use the venv's (make setup, then source .venv/bin/activate)") from None
from common.hydra_errors import composition_errors_as_user_errors
from common.package_files import CONFIG_DIR, register_resolvers
from common.start_up import raise_if_signalled, start_up_interrupts, stop_at_start_up
from common.user_errors import exit_on_user_error
from regen.cancel_on_signal import START_UP_MESSAGE


def job(cfg) -> None:
    """The job Hydra runs with the composed config."""
    from common.run_folders import discard_unless_checked
    from regen.job import run

    raise_if_signalled()
    with exit_on_user_error(), discard_unless_checked():
        run(cfg)


def main() -> None:
    """``@hydra.main`` over :func:`job` (``onpolicy-regen``); signals are handled before Hydra is imported, and
    ``--help`` is written from the YAML."""
    exit_with_help_if_asked("regen", "regen/main.py")
    stop_at_start_up(START_UP_MESSAGE)
    with exit_on_user_error(), start_up_interrupts(), composition_errors_as_user_errors():
        import hydra

        register_resolvers()
        hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="regen")(job)()


if __name__ == "__main__":
    main()
