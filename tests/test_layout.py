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


def product_import_graph() -> dict[str, set[str]]:
    """Each product module's imports of other product modules (``opd.training.loss``; a package is its
    ``__init__``), function-level imports included."""
    paths = {".".join(path.with_suffix("").relative_to(REPO_ROOT).parts).removesuffix(".__init__"): path
             for package in PACKAGES for path in (REPO_ROOT / package).rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in paths else node.module
                          for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        graph[name] = {module for module in found if module in paths and module != name}
    return graph


def cycles_of(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk meets (empty when the graph has none)."""
    state, found = {}, []

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                found.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_no_import_cycle_among_modules_or_rooms():
    """No product module imports itself round a circle, nor does any room (a sub-package, or a top-level module)."""
    graph = product_import_graph()
    assert cycles_of(graph) == []

    def room(module):
        return ".".join(module.split(".")[:2])

    rooms = {}
    for module, targets in graph.items():
        rooms.setdefault(room(module), set()).update(room(target) for target in targets if room(target) != room(module))
    assert cycles_of(rooms) == []
    assert cycles_of({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]  # the walk finds a circle where there is one


def test_opd_keeps_its_entries_at_the_top_and_the_rest_in_rooms():
    """opd's top level holds at most 12 modules and packages (the entries, ``config.py`` and the rooms), and no module
    in a room imports an entry."""
    opd = REPO_ROOT / "opd"
    top = [path.name for path in opd.iterdir()
           if (path.suffix == ".py" and path.name != "__init__.py") or (path / "__init__.py").exists()]
    assert len(top) <= 12, sorted(top)
    entries = {f"opd.{path.stem}" for path in opd.glob("*.py") if path.stem not in ("__init__", "config")}
    back = sorted(f"{module} imports {target}" for module, targets in product_import_graph().items()
                  if module.count(".") >= 2 and module.startswith("opd.") for target in targets & entries)
    assert back == []


def test_readmes_stay_reference_sized():
    """The top README is under 12 KB with its quick start in the first 40 lines and no ± figures; every package README
    is under 25 KB."""
    readme = (REPO_ROOT / "README.md").read_text()
    assert len(readme.encode()) < 12_000
    assert any(line.startswith("## Quick start") for line in readme.splitlines()[:40])
    assert "±" not in readme
    sizes = {package: len((REPO_ROOT / package / "README.md").read_bytes()) for package in PACKAGES}
    assert all(size < 25_000 for size in sizes.values()), sizes
