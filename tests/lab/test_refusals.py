"""Hosts whose data cannot be deployed are refused in one sentence each; the other hosts go on."""

import re

import pytest

from tests.helpers import run_deploy, write_group_data

pytestmark = pytest.mark.lab


def results(output: str) -> dict[str, list[str]]:
    """pyinfra's closing table: operation -> [hosts, success, error, no change]."""
    table = output.split("--> Results:")[1].split("-->")[0]
    return {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line.strip()) for line in table.splitlines()[2:])
            if len(cells) == 5}


def test_one_bad_host_is_refused_and_the_others_converge(deployed_lab, pcie_host, b200_host, tmp_path):
    """An attention kind the B200 class does not tune for fails that host alone, before it is touched."""
    no_mla = write_group_data(tmp_path, "b200_nvlink", (
        "sglang_tuning = copy.deepcopy(base['sglang_tuning'])\n"
        "del sglang_tuning['attention_backends']['mla']"))
    result = run_deploy(group_data=no_mla)
    assert result.returncode != 0 and "Traceback" not in result.output, result.output[-3000:]
    assert (f"[{b200_host.name}] {b200_host.name}: profiles['kimi_k26_dflash']['attention']='mla' is not one of "
            "mha (sglang_tuning attention_backends of b200_nvlink)") in result.output, result.output[-3000:]
    table = results(result.output)
    assert table["SGLang generates"] == ["1", "-", "-", "1"], table  # the PCIe host went all the way
    assert f"[{pcie_host.name}] Success" not in result.output.split("Starting operation: Preflight")[1] \
        .split("-->")[0]  # its preflight passed without a change


@pytest.mark.parametrize("knob, sentence", [
    ("install_driver=maybe", "install_driver='maybe' is not a boolean: use true/false, yes/no or 1/0"),
    ("weights_dir=models", "weights_dir='models' is not accepted: use an absolute path"),
    ("bind_address=0.0.0.0", "the server would listen on 0.0.0.0:30000, beyond loopback, without an API key"),
])
def test_a_bad_knob_refuses_each_host_in_one_line_before_any_change(deployed_lab, lab_hosts, knob, sentence):
    result = run_deploy("--data", knob, timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.output, result.output[-3000:]
    for host in lab_hosts:
        assert f"[{host.name}] {host.name}: {sentence}" in result.output, result.output[-3000:]
    assert re.findall(r"--> Starting operation: (.+?) *$", result.output, flags=re.M) == ["Preflight"]
