"""``onpolicy-serve`` (``python -m launch.chat_server``): the embedded CPU server's command. It imports the server
(torch and aiohttp take seconds) and loads the model with Ctrl-C / SIGTERM ending that start-up in one line and
130 / 143, and a checkpoint it cannot load in its ``error:`` lines (``common.start_up``)."""

from __future__ import annotations

from common.start_up import run_entry


def main() -> None:
    run_entry("launch.chat_server")
