"""The fan-out's peer server (operations/weights/peer.py): its nginx configuration and its unit, as rendered.

The configuration is also served by nginx itself where its binary is at hand (on PATH, /usr/sbin/nginx, or
$SPECFLEET_NGINX, e.g. one `apt-get download nginx && dpkg -x` unpacked), on temp directories; the unit is
rated by `systemd-analyze security --offline`, where systemd-analyze is at hand.
"""

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from deployment.hosts import resolve
from deployment.knobs import BadHostData
from operations.weights import peer
from tests.unit.group_data import host_data

REVISION = "Qwen--Qwen3.6-27B/" + "a" * 40
OTHER = "Qwen--Qwen3.6-27B/" + "b" * 40  # a revision the host holds that the run's fan-out does not serve
MAX_EXPOSURE = 3.0  # as tests/deployed/test_unit.py holds every unit to
NONCE = peer.Nonce()


def weights(**overrides):
    return resolve(host_data("rtx_pro_6000_pcie", **overrides), "rtx_pro_6000_pcie").weights


def peer_server(weights_dir="/srv/specfleet/models", peers=("10.0.0.2", "10.0.0.3"), **overrides):
    return peer.server(weights(**overrides), weights_dir, peers, (REVISION,))


def test_the_configuration_allows_the_runs_peers_and_serves_its_revisions_only():
    text = peer.conf_text(peer_server())
    lines = [line.strip() for line in text.splitlines()]
    server = lines[lines.index("server {"):lines.index(next(line for line in lines if line.startswith("location")))]
    assert [line for line in server if line.startswith(("allow", "deny"))] == [
        "allow 10.0.0.2;", "allow 10.0.0.3;", "deny all;"]
    assert "listen 30900;" in lines and "root /srv/specfleet/models;" in lines
    assert {"sendfile on;", "autoindex off;", "disable_symlinks on;"} <= set(lines)
    assert [line for line in lines if line.startswith("location /")] == [f"location /{REVISION}/ {{", "location / {"]
    assert "limit_except GET {" in lines  # read-only: no PUT, no DELETE


@pytest.mark.parametrize("peers, revision, problem", [
    (("gpu2.lab",), REVISION, "is not an IP address"),
    (("10.0.0.2; allow all",), REVISION, "is not an IP address"),
    (("10.0.0.2",), "Qwen--Qwen3.6-27B/main", "<owner>--<name>/<40-hex commit>"),
    (("10.0.0.2",), "../etc/" + "a" * 40, "<owner>--<name>/<40-hex commit>"),
])
def test_a_peer_named_not_by_address_or_a_malformed_revision_is_refused(peers, revision, problem):
    with pytest.raises(BadHostData, match=problem.replace("<", ".").replace(">", ".")):
        peer.server(weights(), "/srv/specfleet/models", peers, (revision,))


def test_the_unit_runs_as_a_user_of_its_own_in_the_weights_group_out_of_roots_configuration():
    text = peer.unit_text(peer_server())
    lines = text.splitlines()
    assert {"DynamicUser=yes", "User=specfleet-weights-peer", "SupplementaryGroups=sglang", "InaccessiblePaths=-/etc/specfleet",
            "ReadOnlyPaths=/srv/specfleet/models", "ProtectHome=yes", "ProtectSystem=strict",
            "ExecStart=/usr/sbin/nginx -e stderr -c /etc/specfleet-weights-peer/nginx.conf"} <= set(lines)
    assert "[Install]" not in lines  # started while the fan-out runs only
    assert "WantedBy=multi-user.target" in peer.unit_text(peer_server(weights_cache=True))  # a site cache


def exposure(unit_text: str, tmp_path) -> float:
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.skip("no systemd-analyze here")
    path = tmp_path / f"{peer.UNIT}.service"
    path.write_text(unit_text)
    out = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return float(out.rsplit("Overall exposure level for", 1)[1].split(":", 1)[1].split()[0])


@pytest.mark.parametrize("cache", [False, True])
def test_the_unit_is_confined_as_the_others(tmp_path, cache):
    assert exposure(peer.unit_text(peer_server(weights_cache=cache)), tmp_path) <= MAX_EXPOSURE


def nginx_binary() -> str:
    found = os.environ.get("SPECFLEET_NGINX") or shutil.which("nginx") or \
        ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if not found:
        pytest.skip("no nginx here (set SPECFLEET_NGINX to an unpacked one)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPeerServer(peer.PeerServer):
    """The rendered configuration, its runtime and credentials directories under the test's own."""

    runtime = credentials = ""

    @property
    def runtime_dir(self) -> str:
        return self.runtime

    @property
    def credentials_dir(self) -> str:
        return self.credentials


def status(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=2-"}), timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as error:
        return error.code, b""


@pytest.fixture
def served(tmp_path):
    """nginx serving a weights directory with the rendered configuration: a revision of the run, one that is
    not, the fetcher's files in flight, the manifest, and a link out."""
    models = tmp_path / "models"
    revision, other = models / REVISION, models / OTHER
    for directory in (revision / "sub", revision / ".cache/specfleet/parts", other):
        directory.mkdir(parents=True)
    (revision / "model.safetensors").write_bytes(b"0123456789")
    (revision / "sub/config.json").write_bytes(b'{"a": 1}')
    (revision / ".cache/specfleet/parts/model.safetensors.part").write_bytes(b"01234")
    (revision / ".specfleet-manifest.json").write_text("{}")
    (other / "model.safetensors").write_bytes(b"other")
    (tmp_path / "secret").write_text("root's")
    (revision / "linked.json").symlink_to(tmp_path / "secret")

    def start(peers):
        base = peer.server(weights(weights_fanout_port=free_port()), str(models), peers, (REVISION,))
        p = LocalPeerServer(**{f: getattr(base, f) for f in base.__dataclass_fields__})
        p.runtime, p.credentials = str(tmp_path / "run"), str(tmp_path / "credentials")
        os.makedirs(p.runtime, exist_ok=True)
        os.makedirs(p.credentials, exist_ok=True)
        (tmp_path / "credentials" / peer.NONCE_FILE).write_text(NONCE.value)
        conf = tmp_path / "nginx.conf"
        conf.write_text(peer.conf_text(p))
        # As root here, its workers would be nobody's, who cannot read the test's directories.
        extra = ["-g", "user root root;"] if os.geteuid() == 0 else []
        process = subprocess.Popen([nginx_binary(), "-e", "stderr", "-c", str(conf), *extra],
                                   stderr=subprocess.PIPE, text=True)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", p.port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            process.kill()
            pytest.fail(f"nginx did not start: {process.stderr.read()}")
        started.append(process)
        return f"http://127.0.0.1:{p.port}"

    started = []
    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=10)


def test_nginx_serves_the_runs_revision_read_only_and_nothing_else(served):
    url = served(("127.0.0.1",))
    assert status(f"{url}/{REVISION}/model.safetensors") == (206, b"23456789")  # with Range: a fetch resumes
    assert status(f"{url}/{REVISION}/sub/config.json")[0] == 206
    for path in (f"{REVISION}/.cache/specfleet/parts/model.safetensors.part", f"{REVISION}/.specfleet-manifest.json",
                 f"{OTHER}/model.safetensors", REVISION + "/", "Qwen--Qwen3.6-27B/", "", f"{REVISION}/../../secret"):
        assert status(f"{url}/{path}")[0] == 404, path
    assert status(f"{url}/{REVISION}/linked.json")[0] == 403  # the link is not followed
    request = urllib.request.Request(f"{url}/{REVISION}/model.safetensors", data=b"x", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code in (403, 405)


def test_nginx_refuses_an_address_not_of_the_runs_peers(served):
    url = served(("10.0.0.2",))
    assert status(f"{url}/{REVISION}/model.safetensors")[0] == 403
    assert status(f"{url}/{peer.NONCE_PATH}")[0] == 403


def test_nginx_answers_the_runs_nonce_from_its_credential(served):
    url = served(("127.0.0.1",))
    with urllib.request.urlopen(f"{url}/{peer.NONCE_PATH}", timeout=5) as response:
        assert response.read() == NONCE.value.encode()


UNIT_FILE = "/etc/systemd/system/specfleet-weights-peer.service"


@pytest.mark.parametrize("cache, started, unit_file, stopped", [
    (False, True, None, True),  # this run started it: stopped once every host has its files
    (False, False, {"kind": "file"}, True),  # an earlier run left it (interrupted): stopped now
    (False, False, None, False),  # a run with nothing to share: nothing to do, nothing sent
    (True, True, {"kind": "file"}, False),  # weights_cache: kept serving
])
def test_the_peer_server_is_stopped_and_its_unit_removed_after_the_run_unless_kept(cache, started, unit_file,
                                                                                   stopped):
    from operations.basics.file_states import FileStates
    from tests.unit.fakehost import run

    commands, noops = run(peer.stopped, {FileStates: {UNIT_FILE: unit_file}}, weights=weights(weights_cache=cache),
                          started=started)
    assert bool(commands) == stopped and bool(noops) != stopped
    if stopped:
        assert commands == ["systemctl disable --now specfleet-weights-peer.service 2>/dev/null || true",
                            f"rm -f {UNIT_FILE}", "systemctl daemon-reload"]


def test_nginx_is_installed_with_its_own_service_masked_first():
    from pyinfra.facts.deb import DebPackages

    from operations.basics.apt_packages import AptVersions
    from tests.unit.fakehost import run

    assert run(peer.package, {DebPackages: {"nginx": ["1.22.1-9"]}})[1] == ["nginx is installed (its own "
                                                                          "nginx.service masked)"]
    commands, _ = run(peer.package, {DebPackages: {}, AptVersions: {"nginx": ["1.22.1-9"]}})
    assert commands[0] == "systemctl mask nginx.service" and "nginx" in commands[-1] and "install" in commands[-1]


def test_the_run_nonce_is_the_units_credential_and_answered_at_its_own_path():
    """Only the nginx the run configured answers its nonce: a file of the unit's credentials, which root's 0600
    file gives the unit's user alone; no line of the configuration or unit holds the value."""
    p, nonce = peer_server(), peer.Nonce()
    conf, unit = peer.conf_text(p), peer.unit_text(p)
    lines = [line.strip() for line in conf.splitlines()]
    at = lines.index(f"location = /{peer.NONCE_PATH} {{")
    assert lines[at + 1:at + 3] == ["default_type text/plain;",
                                    "alias /run/credentials/specfleet-weights-peer.service/nonce;"]
    assert lines.index("deny all;") < at  # the run's peers alone, as every file
    assert "LoadCredential=nonce:/etc/specfleet-weights-peer/nonce" in unit.splitlines()
    assert nonce.value not in conf + unit + repr(nonce) and len(nonce.value) == 32 and nonce != peer.Nonce()


def test_the_peer_server_writes_the_nonce_through_stdin_alone():
    import itertools
    from types import SimpleNamespace

    from pyinfra.api import Config
    from pyinfra.context import ctx_host, ctx_state

    from operations.basics.file_states import FileStates
    from tests.unit.fakehost import FakeHost

    nonce = peer.Nonce()
    with ctx_host.use(FakeHost({FileStates: {}})), ctx_state.use(SimpleNamespace(config=Config(), cwd=None)):
        # Its first commands: the configuration's directory, then the nonce (the files after it are put as before).
        commands = list(itertools.islice(peer.serving._inner(server=peer_server(), nonce=nonce), 2))
    assert all(nonce.value not in str(c) for c in commands)
    carried = [c.connector_arguments.get("_stdin") for c in commands if hasattr(c, "connector_arguments")]
    assert [c for c in carried if c] == [nonce.value]
    assert str(commands[-1]).endswith("secret /etc/specfleet-weights-peer nonce 600 root")
