"""The layout: product packages import only product code, regen and launch nothing of opd, each package's README
opens with a map of its modules, and no module shadows another when a script runs from its folder
(`python regen/main.py` puts regen/ first on sys.path)."""

from __future__ import annotations

import ast
import importlib.metadata
import sys

import pytest

from tests.helpers.paths import REPO_ROOT

PACKAGES = ("common", "regen", "opd", "tools", "launch")
BESIDE_THE_PRODUCT = ("standins", "benchmarks", "experiments", "tests")  # measure, stand in, experiment, test


def imported_packages(path) -> set[str]:
    """The top-level names a module imports (at any depth of the module, function-level imports included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_product_packages_import_only_product_code(package):
    refused = set(BESIDE_THE_PRODUCT) | ({"opd"} if package in ("regen", "launch", "common", "tools") else set())
    found = {f"{path.relative_to(REPO_ROOT)} imports {name}" for path in (REPO_ROOT / package).rglob("*.py")
             for name in imported_packages(path) & refused}
    assert not found, sorted(found)


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
        for package in (*PACKAGES, *BESIDE_THE_PRODUCT)
        for path in (REPO_ROOT / package).iterdir()
        if (path.suffix == ".py" and path.stem != "__init__" and path.stem.lower() in taken - set(PACKAGES))
        or (path.is_dir() and path.name.lower() in taken - set(PACKAGES))
    ]
    assert not clashes, f"these would shadow an importable module when a script runs from its folder: {clashes}"


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_readme_opens_with_a_map_of_every_module(package):
    """A product package's README.md opens with a section "Where things are" whose table names each of its modules
    once (relative to the package; a row may name several, comma-separated), and only modules that exist."""
    root = REPO_ROOT / package
    readme = (root / "README.md").read_text()
    first_section = readme.split("\n## ", 2)[1]
    assert first_section.startswith("Where things are"), package
    mapped = [cell.strip("`") for line in first_section.splitlines() if line.startswith("| `")
              for cell in line.split(" | ")[0][2:].split(", ")]
    modules = sorted(str(path.relative_to(root)) for path in root.rglob("*.py") if path.name != "__init__.py")
    assert sorted(name for name in mapped if name.endswith(".py")) == modules


def test_each_part_of_regen_says_its_role_in_one_line():
    """Each sub-package of regen/ has a bold row in the map and an ``__init__.py`` that is its role in one line."""
    regen = REPO_ROOT / "regen"
    first_section = (regen / "README.md").read_text().split("\n## ", 2)[1]
    for part in (path.parent for path in regen.glob("*/__init__.py")):
        role = ast.get_docstring(ast.parse((part / "__init__.py").read_text()))
        assert role and "\n" not in role, part.name
        assert f"| **`{part.name}/`** |" in first_section, part.name
