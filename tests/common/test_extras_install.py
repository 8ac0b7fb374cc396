"""``extras_install``: the command for an optional extra fits how the project was installed."""

from __future__ import annotations

from pathlib import Path

import common.package_files as package_files
from common.package_files import extras_install


def test_a_checkout_installs_the_extra_into_itself(monkeypatch):
    monkeypatch.setattr(package_files, "checkout_root", lambda: Path("/src/onpolicy-research"))
    assert extras_install("chart") == "pip install -e '.[chart]'"


def test_an_installed_wheel_installs_the_extra_by_the_package_name(monkeypatch):
    monkeypatch.setattr(package_files, "checkout_root", lambda: None)
    assert extras_install("wandb") == "pip install 'onpolicy-research[wandb]'"
