"""Scripts run as `python regen/main.py`, which puts regen/ first on sys.path: no module may shadow another."""

from __future__ import annotations

import importlib.metadata
import sys

from tests.conftest import REPO_ROOT

PACKAGES = ("common", "regen", "opd", "tools", "launch")


def installed_top_level_names() -> set[str]:
    names = set()
    for dist in importlib.metadata.distributions():
        top = dist.read_text("top_level.txt")
        names.update(top.split() if top else [])
        names.add((dist.metadata["Name"] or "").replace("-", "_").lower())
    return names


def test_no_module_shadows_stdlib_or_dependencies():
    taken = set(sys.stdlib_module_names) | installed_top_level_names()
    clashes = [
        f"{package}/{path.name}"
        for package in PACKAGES
        for path in (REPO_ROOT / package).iterdir()
        if (path.suffix == ".py" and path.stem != "__init__" and path.stem.lower() in taken - set(PACKAGES))
        or (path.is_dir() and path.name.lower() in taken - set(PACKAGES))
    ]
    assert not clashes, f"these would shadow an importable module when a script runs from its folder: {clashes}"
