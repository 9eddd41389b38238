"""Constants with one meaning are written once in the product: the 40-hex commit in deployment/knobs.py.
The host programs run on hosts without the product, so they hold one copy, which this test keeps equal to the
controller's (loopback, typed once for both: tests/unit/test_imports.py)."""

from pathlib import Path

from deployment import knobs
from tests.helpers import host_programs_importable

host_programs_importable()
import weights_manifest  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# The product's Python: the packages and the entry points (group data holds knob values, not constants).
PRODUCT = sorted([*(REPO / "deployment").rglob("*.py"), *(REPO / "operations").rglob("*.py"),
                  *(REPO / "serving_benchmark").rglob("*.py"), *REPO.glob("*.py")])


def written_in(pattern: str) -> list[str]:
    return [str(path.relative_to(REPO)) for path in PRODUCT if pattern in path.read_text()]


def test_the_commit_pattern_is_written_in_knobs_py_and_once_for_the_hosts():
    assert written_in("[0-9a-f]{40}") == ["deployment/knobs.py",
                                          "operations/weights/host_scripts/weights_manifest.py"]
    assert weights_manifest.COMMIT.pattern == knobs.COMMIT.pattern
