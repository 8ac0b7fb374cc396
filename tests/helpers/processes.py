"""Waiting for a process a test started, as long as its work takes on a loaded machine: no wall-clock limit of its
own; a hang ends at pytest's timeout (``timeout`` in pyproject.toml), and the process is killed then."""

from __future__ import annotations

import subprocess


def communicate(process: subprocess.Popen) -> tuple[str, str]:
    """``process.communicate()``; if the wait ends in an exception (pytest's timeout), the process is killed."""
    try:
        return process.communicate()
    except BaseException:
        process.kill()
        process.communicate()
        raise


def loaded(pid: int, library: str) -> bool:
    """Whether the process has mapped a shared library whose name contains ``library`` (``_yaml``: PyYAML's C
    extension, mapped while Hydra is being imported)."""
    with open(f"/proc/{pid}/maps") as maps:
        return any(library in line for line in maps)
