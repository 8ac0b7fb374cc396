"""The stand-in pass (``make test-standin``) runs the tests marked ``uses_tokenizer``: those whose fixtures include
``tokenizer_path``. That is every test that can see which tokenizer was found only while no test finds one another
way, so none may look for the real one itself."""

from __future__ import annotations

import pytest

from tests.helpers.paths import REPO_ROOT

# Where the real tokenizer is looked for: only tests/helpers/paths.py, through the fixtures of tests/conftest.py.
LOOKUPS = ("real_tokenizer_path(", "minimind3-tokenizer", "oc.env:MINIMIND_TOKENIZER")
LOOKERS = {"tests/helpers/paths.py", "tests/conftest.py", "tests/test_suite_selection.py"}


@pytest.fixture
def through_another_fixture(tokenizer_path):
    return tokenizer_path


def test_a_test_reading_the_tokenizer_through_another_fixture_is_marked(request, through_another_fixture):
    assert request.node.get_closest_marker("uses_tokenizer") is not None


def test_a_test_reading_no_tokenizer_is_not_marked(request):
    assert request.node.get_closest_marker("uses_tokenizer") is None


def test_no_test_looks_for_the_real_tokenizer_but_through_the_fixtures():
    """tests/vllm_live is left out: it needs the real tokenizer and runs only in ``make test-vllm``."""
    found = sorted(f"{path.relative_to(REPO_ROOT)}: {lookup}" for path in (REPO_ROOT / "tests").rglob("*.py")
                   if str(path.relative_to(REPO_ROOT)) not in LOOKERS and "vllm_live" not in path.parts
                   for lookup in LOOKUPS if lookup in path.read_text())
    assert found == []
