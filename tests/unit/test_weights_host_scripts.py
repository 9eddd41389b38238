"""The host-side weights programs (operations/weights/host_scripts/), run as plain Python here.

They are the same files the hosts run: imported next to their shared module, and run
through the inline form (`python3 -c`) the facts send.
"""

import hashlib
import json
import os
import subprocess

import pytest

from operations.basics.host_programs import inline
from tests.helpers import host_programs_importable

host_programs_importable()
import verify_weights  # noqa: E402
import weights_disk  # noqa: E402
import weights_manifest  # noqa: E402
import weights_received  # noqa: E402
import weights_state  # noqa: E402

HOSTILE_NAMES = ["../x", "/etc/cron.d/x", "a/../../x", "a//b", "./a", "a\nb", "a\rb", "a\x00b", "a\x7fb",
                 "a\u2028b", "", ".cache/huggingface/download/x", weights_manifest.MANIFEST]
FINE_NAMES = ["config.json", "model-00001-of-00064.safetensors", "sub/dir/file.bin", ".gitattributes",
              "weird name (1).json", "ünïcode.txt"]


def listing_entry(path: str, data: bytes, lfs: bool) -> dict:
    return {"path": path, "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest() if lfs else None,
            "git_sha1": None if lfs else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}


@pytest.fixture
def weights_dir(tmp_path):
    """A complete two-file weights directory and its listing."""
    files = {"config.json": (b'{"model_type": "llama"}', False), "sub/model.safetensors": (os.urandom(3000), True)}
    listing = []
    for path, (data, lfs) in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)
        listing.append(listing_entry(path, data, lfs))
    weights_manifest.write(tmp_path, "org/repo", "a" * 40, listing)
    return tmp_path, listing


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_file_names_are_refused(name):
    assert weights_manifest.path_problem(name)
    assert weights_manifest.entry_problem({"path": name, "size": 1, "sha256": None, "git_sha1": "0" * 40})


@pytest.mark.parametrize("name", FINE_NAMES)
def test_ordinary_file_names_pass(name):
    assert weights_manifest.path_problem(name) is None


@pytest.mark.parametrize("entry, problem", [
    ({"path": "a", "size": -1, "sha256": "0" * 64}, "size"),
    ({"path": "a", "size": True, "sha256": "0" * 64}, "size"),
    ({"path": "a", "size": "5", "sha256": "0" * 64}, "size"),
    ({"path": "a", "size": 5, "sha256": "0" * 63 + "\n"}, "sha256"),
    ({"path": "a", "size": 5, "sha256": None, "git_sha1": "z" * 40}, "git blob id"),
])
def test_malformed_sizes_and_hashes_are_refused(entry, problem):
    assert problem in weights_manifest.entry_problem(entry)


def test_inside_refuses_links_out_of_the_directory(tmp_path):
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "out").symlink_to(tmp_path)
    assert weights_manifest.inside(weights, "a/b") == str(weights / "a/b")
    for name in ("out/x", "../x", "/etc/passwd"):
        with pytest.raises(ValueError):
            weights_manifest.inside(weights, name)


def test_state_reports_commit_and_wrong_sizes(weights_dir, tmp_path_factory):
    directory, listing = weights_dir
    missing = str(tmp_path_factory.mktemp("empty"))
    sizes = {e["path"]: e["size"] for e in listing}
    (directory / "config.json").write_bytes(b"{}")
    assert weights_state.main({str(directory): sizes, missing: sizes}) == {
        str(directory): {"commit": "a" * 40, "bad": ["config.json"]}, missing: None}
    manifest = weights_manifest.read(directory)
    manifest["files"]["../elsewhere"] = manifest["files"].pop("sub/model.safetensors")  # edited by hand
    (directory / weights_manifest.MANIFEST).write_text(json.dumps(manifest))
    assert weights_state.main({str(directory): sizes})[str(directory)]["bad"] == ["config.json", "sub/model.safetensors"]


def test_verify_names_changed_bytes_and_links_out(weights_dir, tmp_path_factory):
    directory, listing = weights_dir
    assert verify_weights.corrupt(str(directory), listing) == []
    data = bytearray((directory / "sub/model.safetensors").read_bytes())
    data[100] ^= 0xFF
    (directory / "sub/model.safetensors").write_bytes(bytes(data))
    outside = tmp_path_factory.mktemp("outside") / "config.json"
    outside.write_bytes((directory / "config.json").read_bytes())
    (directory / "config.json").unlink()
    (directory / "config.json").symlink_to(outside)  # same bytes, but not inside the directory
    assert verify_weights.corrupt(str(directory), listing) == ["config.json", "sub/model.safetensors"]


def test_disk_lists_files_outside_the_cache(weights_dir):
    directory, _ = weights_dir
    (directory / ".cache").mkdir()
    (directory / ".cache/partial").write_bytes(b"xx")
    found = weights_disk.disk(str(directory / "not-yet" / "there"))
    assert found["checked"] == str(directory) and found["files"] == {} and found["free"] > 0
    assert set(weights_disk.disk(str(directory))["files"]) == {
        "config.json", "sub/model.safetensors", weights_manifest.MANIFEST}


def test_inline_programs_run_as_sent(weights_dir):
    """The inline form carries the shared module: what the facts send runs on a bare python3."""
    directory, listing = weights_dir
    sizes = json.dumps({str(directory): {e["path"]: e["size"] for e in listing}})
    for command, expected in [
        (inline("weights_state", sizes), {str(directory): {"commit": "a" * 40, "bad": []}}),
        (inline("verify_weights", str(directory), json.dumps(listing)), []),
    ]:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"})
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == expected
    assert inline("verify_weights", "d", "[]", user="sglang").startswith("runuser -u sglang -- python3 -c ")


def run_with_alarm(seconds: int, function, *args):
    """function(*args), failing the test instead of hanging when it blocks (a FIFO opened for reading)."""
    import signal

    def blocked(signum, frame):
        raise TimeoutError(f"{function.__name__} blocked for {seconds}s")
    previous = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(seconds)
    try:
        return function(*args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_root_reads_no_manifest_through_a_link_and_never_blocks_on_a_fifo(weights_dir, tmp_path_factory):
    """What the service user can plant in its weights directory, which root's state program reads:
    a manifest linked to a file root may read (here a valid manifest elsewhere: its content would reach
    the controller), or a FIFO (a blocking open would hang the deploy)."""
    directory, listing = weights_dir
    sizes = {e["path"]: e["size"] for e in listing}
    elsewhere = tmp_path_factory.mktemp("root-only") / "secret.json"
    elsewhere.write_text(json.dumps({"commit": "root's secret", "files": {}}))
    manifest = directory / weights_manifest.MANIFEST
    manifest.unlink()
    manifest.symlink_to(elsewhere)
    assert weights_manifest.read(directory) is None
    assert weights_state.main({str(directory): sizes}) == {str(directory): None}  # incomplete: fetched again
    manifest.unlink()
    os.mkfifo(manifest)
    assert run_with_alarm(5, weights_state.main, {str(directory): sizes}) == {str(directory): None}


def test_what_each_fetcher_received_is_read_from_its_manifest_not_through_a_link_nor_a_fifo(weights_dir,
                                                                                             tmp_path_factory):
    """The run's table's bytes from the hub and from peers (weights_received.py, root's, in the download
    user's directories): a manifest's `received`, as sent inline; None for one linked elsewhere or a FIFO."""
    directory, listing = weights_dir
    received = {"hub": 1200, "peers": 1823, "by_peer": {"lab-pcie-2": 1823}}
    weights_manifest.write(directory, "org/repo", "a" * 40, listing, received=received)
    plain = tmp_path_factory.mktemp("no-received")
    weights_manifest.write(plain, "org/repo", "b" * 40, listing)
    done = subprocess.run(inline("weights_received", str(directory), str(plain), str(tmp_path_factory.mktemp("empty"))),
                          shell=True, capture_output=True, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert list(json.loads(done.stdout).values()) == [received, None, None]
    elsewhere = tmp_path_factory.mktemp("root-only") / "secret.json"
    elsewhere.write_text(json.dumps({"commit": "a" * 40, "received": {"hub": "root's secret"}}))
    manifest = directory / weights_manifest.MANIFEST
    manifest.unlink()
    manifest.symlink_to(elsewhere)
    assert weights_received.main([str(directory)]) == {str(directory): None}
    manifest.unlink()
    os.mkfifo(manifest)
    assert run_with_alarm(5, weights_received.main, [str(directory)]) == {str(directory): None}


def test_root_stats_no_weights_file_through_a_link(weights_dir, tmp_path_factory):
    directory, listing = weights_dir
    sizes = {e["path"]: e["size"] for e in listing}
    outside = tmp_path_factory.mktemp("root-only") / "config.json"
    outside.write_bytes((directory / "config.json").read_bytes())  # the listed size, outside the directory
    (directory / "config.json").unlink()
    (directory / "config.json").symlink_to(outside)
    assert weights_state.main({str(directory): sizes})[str(directory)]["bad"] == ["config.json"]
    linked = tmp_path_factory.mktemp("linked-dir")  # a link further up the path, to a file of the listed size
    (directory / "sub" / "model.safetensors").rename(linked / "model.safetensors")
    (directory / "sub").rmdir()
    (directory / "sub").symlink_to(linked)
    assert weights_state.main({str(directory): sizes})[str(directory)]["bad"] == ["config.json", "sub/model.safetensors"]
    assert weights_disk.disk(str(directory))["files"]["config.json"] == len(str(outside))  # the link's own size
