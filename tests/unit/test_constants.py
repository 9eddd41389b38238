"""Constants with one meaning are written once in the product: loopback in operations/basics/network.py,
the 40-hex commit in operations/basics/knobs.py. The host programs run on hosts without the product, so
each holds one copy there, which these tests keep equal to the controller's."""

from pathlib import Path

from operations.basics import knobs, network
from tests.helpers import host_programs_importable

host_programs_importable()
import owned_sockets  # noqa: E402
import weights_manifest  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# The product's Python: the packages and the entry points (group data holds knob values, not constants).
PRODUCT = sorted([*(REPO / "operations").rglob("*.py"), *(REPO / "serving_benchmark").rglob("*.py"),
                  *REPO.glob("*.py")])


def written_in(pattern: str) -> list[str]:
    return [str(path.relative_to(REPO)) for path in PRODUCT if pattern in path.read_text()]


def test_loopback_is_written_in_network_py_and_once_for_the_hosts():
    assert written_in("127.0.0.1") == ["operations/basics/host_scripts/owned_sockets.py",
                                       "operations/basics/network.py"]
    assert owned_sockets.LOOPBACK == network.LOOPBACK


def test_the_commit_pattern_is_written_in_knobs_py_and_once_for_the_hosts():
    assert written_in("[0-9a-f]{40}") == ["operations/basics/knobs.py",
                                          "operations/weights/host_scripts/weights_manifest.py"]
    assert weights_manifest.COMMIT.pattern == knobs.COMMIT.pattern
