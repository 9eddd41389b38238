"""Hosts whose data cannot be deployed are refused in one sentence each; the other hosts go on."""

import pytest

from lab import fleet
from tests.helpers import SGLANG_UNIT, operations_started, results_table, run_deploy, write_group_data

pytestmark = pytest.mark.lab


def refused_only(output: str) -> bool:
    """A refused host starts its refusal and the run's summary, nothing else (preflight's checks, when the
    refusal is theirs; preflight.refused, naming the reason, when it is the host's data)."""
    return all(op in ("Preflight", "Summary") or op.startswith("preflight.refused (problem=")
               for op in operations_started(output))


def test_one_bad_host_is_refused_and_the_others_converge(deployed_lab, pcie_host, b200_host, tmp_path):
    """An attention kind the B200 class does not tune for fails that host alone, before it is touched."""
    no_mla = write_group_data(tmp_path, "b200_nvlink", (
        "sglang_tuning = copy.deepcopy(base['sglang_tuning'])\n"
        "del sglang_tuning['attention_backends']['mla']"))
    result = run_deploy(group_data=no_mla)
    assert result.returncode != 0 and "Traceback" not in result.output, result.output[-3000:]
    assert (f"[{b200_host.name}] {b200_host.name}: profiles['kimi_k26_dflash']['attention']='mla' is not accepted: "
            "use one of mha (sglang_tuning attention_backends of b200_nvlink)") in result.output, result.output[-3000:]
    table = results_table(result.output)
    assert table[f"SGLang generates {SGLANG_UNIT}"] == ["1", "-", "-", "1"], table  # the PCIe host went all the way


@pytest.mark.parametrize("knob, sentence", [
    ("install_driver=maybe", "install_driver='maybe' is not a boolean: use true/false, yes/no or 1/0"),
    ("weights_dir=models", "weights_dir='models' is not accepted: use an absolute path"),
    ("bind_address=0.0.0.0", "the servers would listen on 0.0.0.0, beyond loopback, without an API key"),
])
def test_a_bad_knob_refuses_each_host_in_one_line_before_any_change(deployed_lab, lab_hosts, knob, sentence):
    result = run_deploy("--data", knob, timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.output, result.output[-3000:]
    for host in lab_hosts:
        assert f"[{host.name}] {host.name}: {sentence}" in result.output, result.output[-3000:]
    assert refused_only(result.output)


def test_root_as_the_service_user_is_refused_and_roots_login_kept(deployed_lab, pcie_host):
    result = run_deploy("--data", "service_user=root", "--limit", pcie_host.name, timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.output, result.output[-3000:]
    assert (f"[{pcie_host.name}] {pcie_host.name}: service_user='root' is not accepted: use a user of the "
            "service's own, not root") in result.output, result.output[-3000:]
    assert refused_only(result.output)
    assert fleet.ssh(pcie_host, "getent passwd root | cut -d: -f7").strip() == "/bin/bash"


def test_an_existing_login_account_as_the_service_user_is_refused_untouched(deployed_lab, pcie_host):
    fleet.ssh(pcie_host, "id specfleet-alice >/dev/null 2>&1 || useradd -m -s /bin/bash specfleet-alice")
    try:
        before = fleet.ssh(pcie_host, "getent passwd specfleet-alice")
        result = run_deploy("--data", "service_user=specfleet-alice", "--limit", pcie_host.name, timeout=120)
        assert result.returncode != 0 and "Traceback" not in result.output, result.output[-3000:]
        uid = before.split(":")[2]
        assert (f"[{pcie_host.name}] {pcie_host.name}: service_user='specfleet-alice': the account specfleet-alice "
                f"is a login account (uid {uid}, not a system user's below 1000)") in result.output, result.output[-3000:]
        assert operations_started(result.output) == ["Preflight"]
        assert fleet.ssh(pcie_host, "getent passwd specfleet-alice") == before  # its shell and home kept
    finally:
        fleet.ssh(pcie_host, "userdel -r specfleet-alice 2>/dev/null || true")


@pytest.mark.parametrize("code, refused", [
    ("sglang_tuning = copy.deepcopy(base['sglang_tuning'])\nsglang_tuning['extra_args'] += ['--host', '0.0.0.0']",
     "sglang_tuning extra_args="),
    ("profiles = copy.deepcopy(base['profiles'])\nprofiles['kimi_k26_dflash']['server_args'] += ['--host=0.0.0.0']",
     "profiles['kimi_k26_dflash']['server_args']="),
])
def test_extra_arguments_cannot_move_the_server_past_the_exposure_check(deployed_lab, pcie_host, tmp_path, code,
                                                                         refused):
    group = "rtx_pro_6000_pcie" if "sglang_tuning" in code else "all"
    result = run_deploy("--limit", pcie_host.name, group_data=write_group_data(tmp_path, group, code), timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.output, result.output[-3000:]
    assert f"[{pcie_host.name}] {pcie_host.name}: {refused}" in result.output, result.output[-3000:]
    assert "use bind_address for --host, which the deploy sets itself" in result.output
    assert refused_only(result.output)
    listening = fleet.ssh(pcie_host, "ss -Hltn 'sport = :30000' | awk '{print $4}'").split()
    assert listening == ["127.0.0.1:30000"], listening
