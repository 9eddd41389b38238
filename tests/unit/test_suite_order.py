"""make test's order (tests/conftest.py): the modules it starts first exist under the names it gives them."""

from tests.conftest import LONGEST_FIRST
from tests.helpers import REPO


def test_every_module_the_suite_starts_first_exists():
    missing = [module for module in LONGEST_FIRST if not (REPO / module).is_file()]
    assert missing == [], f"tests/conftest.py LONGEST_FIRST names modules that are gone: {missing}"
