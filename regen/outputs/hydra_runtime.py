r"""What regen takes from, and gives back to, the Hydra run it is part of (nothing outside a Hydra app).

``run_folder()`` and ``multirun_overrides()`` read the job; ``scrub_credentials()`` removes ``user:password@`` from
the URLs in Hydra's record of the job (``.hydra/*.yaml``, ``multirun.yaml``, escaped overrides such as
``http\://alice\:pw@host`` included), and ``StripCredentials`` from the launcher's console lines.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from hydra.experimental.callback import Callback

from common.atomic_write import atomic_write_text

# a scheme, as written or with Hydra's escaped colon (``http\://``), then user info up to its ``@``
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*\\?://)[^/@\s'\"\],]+@")
LAUNCHER_LOGGER = "hydra._internal.core_plugins.basic_launcher"  # logs each multirun job's overrides


def _hydra_config():
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get()
    except (ImportError, ValueError):  # not inside a Hydra app (tests call run() directly)
        return None


def run_folder() -> Path | None:
    """The run's Hydra folder (a multirun's sweep folder, shared by its jobs); ``None`` outside a Hydra app."""
    hydra_cfg = _hydra_config()
    if hydra_cfg is None:
        return None
    from hydra.types import RunMode

    return Path(hydra_cfg.sweep.dir if hydra_cfg.mode == RunMode.MULTIRUN else hydra_cfg.runtime.output_dir)


def multirun_overrides() -> str | None:
    """In a Hydra multirun, this job's overrides (``job{N}`` when it has none); else ``None``."""
    hydra_cfg = _hydra_config()
    if hydra_cfg is None:
        return None
    from hydra.types import RunMode

    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    return hydra_cfg.job.override_dirname or f"job{hydra_cfg.job.num}"


def strip_credentials(text: str) -> str:
    """``text`` with every ``scheme://user:password@`` turned into ``scheme://``."""
    return _URL_CREDENTIALS.sub(r"\g<scheme>", text)


class StripCredentials(logging.Filter):
    """A logging filter that removes URL credentials from every line it passes (``strip_credentials``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if (clean := strip_credentials(message)) != message:
            record.msg, record.args = clean, ()
        return True


class ConsoleWithoutCredentials(Callback):
    """Hydra callback: filters URL credentials out of the launcher's per-job override lines."""

    def on_multirun_start(self, config, **kwargs) -> None:
        logging.getLogger(LAUNCHER_LOGGER).addFilter(StripCredentials())


def scrub_credentials() -> None:
    """Rewrite Hydra's record of this job (and of its sweep) without URL credentials."""
    hydra_cfg = _hydra_config()
    if hydra_cfg is None:
        return
    records = []
    if hydra_cfg.output_subdir is not None:
        records += sorted((Path(hydra_cfg.runtime.output_dir) / hydra_cfg.output_subdir).glob("*.yaml"))
    records.append(Path(hydra_cfg.sweep.dir) / "multirun.yaml")
    for path in records:
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            if (clean := strip_credentials(text)) != text:
                atomic_write_text(path, clean)
