"""The HF token and the weights are the download user's: a host a deploy without that user left (the token in
the service user's HF_HOME, the weights the service user's, the unit without the download user's home made
inaccessible) converges on the next run, its unit restarted once, and a second run changes nothing; a gated
repo is downloaded by the download user."""

import pytest

from lab import fleet
from tests.faults.faultlab import DRAFTER_DIR, TARGET_DIR
from tests.helpers import SGLANG_UNIT, UNIT_FILE, changed_operations, main_pid, run_deploy

pytestmark = pytest.mark.lab

TOKEN = "/home/sglang-download/.cache/huggingface/token"
EARLIER_TOKEN = "/home/sglang/.cache/huggingface/token"
REPO_DIRS = tuple(path.rsplit("/", 1)[0] for path in (TARGET_DIR, DRAFTER_DIR))
# What the deploy without a download user left, laid down from the current one: the token the service
# user's, mode 0600 in its own HF_HOME; every repo directory and file the service user's, 0700/0600 (the
# fetcher's umask); the unit making that HF_HOME inaccessible instead of the download user's home.
EARLIER = f"""set -e
runuser -u sglang -- sh -c 'umask 077 && mkdir -p /home/sglang/.cache/huggingface'
install -o sglang -g sglang -m 0600 {TOKEN} {EARLIER_TOKEN}
rm -f {TOKEN}
for dir in {' '.join(REPO_DIRS)}; do chown -R sglang:sglang $dir && chmod -R go-rwx $dir; done
sed -i 's#^InaccessiblePaths=-/home/sglang-download$#InaccessiblePaths=-/home/sglang/.cache/huggingface#' {UNIT_FILE}
systemctl daemon-reload && systemctl restart {SGLANG_UNIT}
"""


def owners(host) -> set[str]:
    """Owner, group and mode of everything in the repo directories."""
    return set(fleet.ssh(host, f"find {' '.join(REPO_DIRS)} -printf '%u:%g %y%m\\n' | sed 's/ [fd]/ /' | sort -u")
               .split("\n")) - {""}


def test_a_host_deployed_without_the_download_user_converges_to_it_once(deployed_lab, pcie_host):
    host = pcie_host
    fleet.ssh(host, EARLIER)
    assert fleet.ssh(host, f"runuser -u sglang -- cat {EARLIER_TOKEN} > /dev/null && echo read").strip() == "read"
    pid = main_pid(host)
    converged = run_deploy("--limit", host.name)
    assert converged.returncode == 0, converged.output[-3000:]
    assert main_pid(host) != pid  # its unit changed: restarted, once
    assert fleet.ssh(host, f"stat -c '%U %a' {TOKEN}").split() == ["sglang-download", "600"]
    assert fleet.ssh(host, f"test -e {EARLIER_TOKEN} || echo gone").strip() == "gone"
    assert fleet.ssh(host, f"runuser -u sglang -- cat {TOKEN} > /dev/null 2>&1 || echo refused").strip() == "refused"
    assert owners(host) == {"sglang-download:sglang 750", "sglang-download:sglang 640"}
    again = run_deploy("--limit", host.name)
    assert again.returncode == 0 and changed_operations(again.output) == [], again.output[-3000:]


def test_the_download_user_fetches_a_gated_repo_the_service_user_reads_and_cannot_write(deployed_lab, pcie_host):
    """The lab's DFlash drafter is gated: hf_lab_granted has accepted its terms."""
    host, drafter_repo = pcie_host, REPO_DIRS[1]
    fleet.ssh(host, f"rm -rf {drafter_repo}")
    fetched = run_deploy("--limit", host.name)
    assert fetched.returncode == 0, fetched.output[-3000:]
    assert fleet.ssh(host, f"stat -c '%U:%G %a' {DRAFTER_DIR}/config.json").strip() == "sglang-download:sglang 640"
    probe = (f"cat {DRAFTER_DIR}/config.json > /dev/null && echo read; touch {DRAFTER_DIR}/x 2>/dev/null && echo wrote; "
             f"rm -f {DRAFTER_DIR}/config.json 2>/dev/null && echo removed")
    assert fleet.ssh(host, f"runuser -u sglang -- sh -c '{probe}'", check=False).split() == ["read"]
