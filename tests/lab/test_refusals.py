"""Hosts whose data cannot be deployed are refused in one sentence each; the other hosts go on."""

import pytest

from tests.helpers import SGLANG_UNIT, operations_started, results_table, run_deploy, write_group_data

pytestmark = pytest.mark.lab


def test_one_bad_host_is_refused_and_the_others_converge(deployed_lab, pcie_host, b200_host, tmp_path):
    """An attention kind the B200 class does not tune for fails that host alone, before it is touched."""
    no_mla = write_group_data(tmp_path, "b200_nvlink", (
        "sglang_tuning = copy.deepcopy(base['sglang_tuning'])\n"
        "del sglang_tuning['attention_backends']['mla']"))
    result = run_deploy(group_data=no_mla)
    assert result.returncode != 0 and "Traceback" not in result.output, result.output[-3000:]
    assert (f"[{b200_host.name}] {b200_host.name}: profiles['kimi_k26_dflash']['attention']='mla' is not one of "
            "mha (sglang_tuning attention_backends of b200_nvlink)") in result.output, result.output[-3000:]
    table = results_table(result.output)
    assert table[f"SGLang generates {SGLANG_UNIT}"] == ["1", "-", "-", "1"], table  # the PCIe host went all the way


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
    assert operations_started(result.output) == ["Preflight"]
