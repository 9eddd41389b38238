"""The model's code runs as the service user and reaches no secret: the HF token and the weights belong to
a download user of their own (the service user reads the weights through its group), and every process
that imports the model's code runs confined as the server's unit is. Facts in, commands out."""

import pytest
from pyinfra.facts.files import Directory

from operations.basics.file_states import FileStates
from operations.basics.knobs import BadHostData
from operations.basics.templates import render
from operations.deployment import resolve
from operations.weights import download
from tests.unit.fakehost import run
from tests.unit.group_data import host_data

DEPLOYMENT = resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie")
W, S = DEPLOYMENT.weights, DEPLOYMENT.server


def directory(user: str, group: str, mode: str) -> dict:
    return dict(kind="directory", mode=mode, user=user, group=group, sha1=None)


def test_the_weights_and_token_belong_to_the_download_user_read_by_the_service_group():
    assert (W.owner, W.reader) == ("sglang-download", "sglang") == (S.download_user, S.service_user)
    assert W.hf_home == S.hf_home == "/home/sglang-download/.cache/huggingface"
    assert W.earlier_token_file == "/home/sglang/.cache/huggingface/token"


def test_the_download_user_cannot_be_the_service_user():
    with pytest.raises(BadHostData, match="download_user='sglang' is the service user"):
        resolve(host_data("rtx_pro_6000_pcie", download_user="sglang"), "rtx_pro_6000_pcie")
    with pytest.raises(BadHostData, match="download_user='root' is not accepted"):
        resolve(host_data("rtx_pro_6000_pcie", download_user="root"), "rtx_pro_6000_pcie")


def test_a_missing_repo_directory_is_made_the_download_users_group_the_service_users_0750():
    facts = {FileStates: {}, Directory: None}
    commands, _ = run(download.owned, facts, weights=W)
    assert commands == [c for r in W.repos for c in (f"mkdir -p {r.repo_dir}", f"chmod 750 {r.repo_dir}",
                                                      f"chown sglang-download:sglang {r.repo_dir}")]


def test_weights_an_earlier_deployment_gave_the_service_user_are_re_owned_links_not_followed():
    ok = {r.repo_dir: directory("sglang-download", "sglang", "750") for r in W.repos}
    target = W.target.repo_dir
    facts = {FileStates: {**ok, target: directory("sglang", "sglang", "700")}}
    commands, _ = run(download.owned, facts, weights=W)
    assert commands == [f"chown -R --no-dereference sglang-download:sglang {target}",
                        f"chmod -R u=rwX,g=rX,o= {target}"]
    commands, noops = run(download.owned, {FileStates: ok}, weights=W)
    assert commands == [] and noops == ["the weights are sglang-download's, read by the group sglang"]


def test_the_fetcher_runs_as_the_download_user_writing_files_the_service_group_reads():
    text = render("weights/weights.service.j2", w=W, repo=W.target, commit="a" * 40, spec_file="/etc/specfleet/s.json")
    assert "\nUser=sglang-download\nGroup=sglang\n" in text
    # The later UMask= wins over hardening.j2's 0077 (systemd takes a setting's last assignment).
    assert text.index("\nUMask=0027\n") > text.index("\nUMask=0077\n")
    assert f"\nEnvironment=HF_HOME={W.hf_home}\n" in text and f"ReadWritePaths={W.target.repo_dir} {W.hf_home}\n" in text
