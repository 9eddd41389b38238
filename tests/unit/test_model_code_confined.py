"""The model's code runs as the service user and reaches no secret: the HF token and the weights belong to
a download user of their own (the service user reads the weights through its group), and every process
that imports the model's code runs confined as the server's unit is. Facts in, commands out."""

import shlex

import pytest
from pyinfra.context import ctx_host
from pyinfra.facts.files import Directory

from deployment.hosts import resolve
from deployment.knobs import BadHostData
from operations.basics.file_states import FileStates
from operations.basics.templates import render
from operations.server import sandbox
from operations.server.flags import SGLangRejects
from operations.weights import download, hf_token  # noqa: F401 (hf_token registers the facts it reads)
from serving_benchmark import client, modes, units
from serving_benchmark.plan import plan
from tests.unit.fakehost import run
from operations.gpu.facts import NvidiaDriver
from tests.unit.group_data import RTX_MINORS, captured_driver, host_data

DEPLOYMENT = resolve(host_data("rtx_pro_6000_pcie"), "rtx_pro_6000_pcie")
W, S = DEPLOYMENT.weights, DEPLOYMENT.replicas[0]
SERVICE = S.engine.service  # what every server of the host shares


def directory(user: str, group: str, mode: str) -> dict:
    return dict(kind="directory", mode=mode, user=user, group=group, sha1=None)


def test_the_weights_and_token_belong_to_the_download_user_read_by_the_service_group():
    assert (W.owner, W.reader) == ("sglang-download", "sglang") == (SERVICE.download_user, SERVICE.service_user)
    assert W.hf_home == SERVICE.hf_home == "/home/sglang-download/.cache/huggingface"
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
    assert f"\nEnvironment=HF_HOME={W.hf_home}\n" in text
    assert f"\nReadWritePaths={W.target.repo_dir} {W.hf_home}\n" in text


def properties(words: list[str]) -> list[str]:
    return [word.removeprefix("--property=") for word in words if word.startswith("--property=")]


def test_the_flag_check_runs_in_a_transient_unit_confined_as_the_replicas_keyless_and_bounded():
    """It imports the model's code (--trust-remote-code): never in the deploy's own shell, as runuser ran it."""
    command = SGLangRejects().command(venv=S.engine.venv, args=("--model-path", S.engine.model_dir),
                                      env=(("HF_HOME", S.engine.server_hf_home),),
                                      settings=sandbox.check_settings(S, RTX_MINORS))
    assert command.startswith("cd / && systemd-run --quiet --wait --pipe --collect --service-type=exec ")
    assert "runuser" not in command and f" -- {S.engine.venv}/bin/python -c " in command
    found = properties(shlex.split(command))
    unit_text, _ = sandbox.unit_files(S, "", RTX_MINORS)
    for setting in ("User=sglang", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=read-only",
                    "PrivateTmp=yes", "ProtectProc=invisible", f"InaccessiblePaths=-{SERVICE.download_home}",
                    "RestrictNamespaces=yes", "SystemCallFilter=@system-service"):
        assert setting in unit_text and setting in found, setting  # the replica unit's, one source
    for setting in (f"InaccessiblePaths=-{SERVICE.config_dir}", "KillMode=control-group",
                    f"RuntimeMaxSec={sandbox.CHECK_MAX_S}"):
        assert setting in found, setting
    assert "--setenv=HF_HUB_OFFLINE=1" in command and f"--setenv=HF_HOME={S.engine.server_hf_home}" in command


def test_the_deploy_asks_the_flag_check_with_the_replicas_confinement():
    asked = []

    class Host:
        def get_fact(self, fact, **kwargs):
            asked.append((fact, kwargs))
            return captured_driver() if fact is NvidiaDriver else None

    host = Host()
    with ctx_host.use(host):
        assert sandbox.rejection(host, S, ["--model-path", S.engine.model_dir]) is None
    [(driver, _), (fact, kwargs)] = asked  # the replica's GPUs' nodes from the host's driver, then the check
    assert driver is NvidiaDriver and fact is SGLangRejects and kwargs["settings"] == sandbox.check_settings(S, RTX_MINORS)


def test_the_bench_client_runs_in_a_transient_unit_confined_as_the_replica_keyless_but_through_a_gateway():
    bench_plan = plan({})
    remote = "/var/lib/specfleet-bench/r/ar/c4"
    command = client.client_unit_command(S, bench_plan, remote, 4, [S.url], RTX_MINORS)
    assert command[:5] == ["systemd-run", "--unit=specfleet-bench-client", "--collect", "--quiet",
                           "--service-type=exec"]
    assert command[-3:-1] == ["/bin/sh", "-c"] and "$" not in command[-1]  # systemd expands $ in a command line
    assert "setsid" not in " ".join(command) and "runuser" not in " ".join(command)
    assert [a for a in command if a.startswith("--setenv=")] == [f"--setenv=HF_HOME={S.engine.server_hf_home}"]
    found = properties(command)
    for setting in ("User=sglang", "ProtectSystem=strict", "ProtectProc=invisible",
                    f"InaccessiblePaths=-{SERVICE.download_home}", f"InaccessiblePaths=-{SERVICE.config_dir}", "KillMode=control-group", f"WorkingDirectory={remote}",
                    f"ReadWritePaths={remote}", f"RuntimeMaxSec={client.level_bound_s(bench_plan, 4)}"):
        assert setting in found, setting
    # Through a gateway it reads the clients' key file (the key the gateway asks of every client).
    through = properties(client.client_unit_command(S, bench_plan, remote, 4, ["http://127.0.0.1:30080"],
                                                   RTX_MINORS, through_gateway=True))
    assert f"InaccessiblePaths=-{SERVICE.config_dir}" not in through and f"InaccessiblePaths=-{SERVICE.download_home}" in through
    # Its packets go to loopback alone, as the replica's; through a gateway on another host, to that one's API too.
    assert [s for s in found if s.startswith("IPAddress")] == ["IPAddressDeny=any", "IPAddressAllow=127.0.0.0/8 ::1/128"]
    elsewhere = properties(client.client_unit_command(S, bench_plan, remote, 4, ["http://10.1.0.2:30080"],
                                                     RTX_MINORS, through_gateway=True))
    assert [s for s in elsewhere if s.startswith("IPAddress")] == [
        "IPAddressDeny=any", "IPAddressAllow=127.0.0.0/8 ::1/128", "IPAddressAllow=10.1.0.2"]
    # The bench's servers are keyless too.
    bench_server = properties(units.bench_unit_command(S, modes.mode_args(S, "ar"), 600, RTX_MINORS))
    assert f"InaccessiblePaths=-{SERVICE.config_dir}" in bench_server

