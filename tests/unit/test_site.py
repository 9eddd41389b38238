"""The user's site directory (SPECFLEET_SITE) over the shipped group data, and pin.py writing its pins,
against the lab hub on 127.0.0.1 and a git repository on disk (pyinfra loads the group data as it does
for a deploy: tests/deployed/hosts.py load_inventory)."""

import json
import subprocess
import sys

import pytest

from tests.deployed.hosts import load_inventory
from tests.helpers import REPO

DDTREE_REQUIREMENT = ("sglang @ git+https://github.com/sgl-project/sglang@refs/pull/29907/head"
                      "#subdirectory=python")


def git(*args, cwd) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def sglang_repo(tmp_path):
    """A git repository standing in for SGLang's, with the pull request's ref."""
    repo = tmp_path / "sglang.git"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    (repo / "README").write_text("one\n")
    git("add", ".", cwd=repo)
    git("commit", "-q", "-m", "one", cwd=repo)
    git("update-ref", "refs/pull/29907/head", "HEAD", cwd=repo)
    return repo


@pytest.fixture
def site(tmp_path, hub, sglang_repo, monkeypatch):
    """A site directory pointing the deploy at the lab hub (as a mirror, revisions `main`) and the repo."""
    directory = tmp_path / "site"
    (directory / "group_data").mkdir(parents=True)
    (directory / "group_data" / "all.py").write_text(
        f"hf_endpoint = {hub.url!r}\n"
        "allow_http_hub = True\n"
        "mirrors['repos'].update({'moonshotai/Kimi-K2.6': 'lab/Kimi-K2.6-tiny', "
        "'z-lab/Kimi-K2.6-DFlash': 'lab/Kimi-K2.6-DFlash-tiny', 'Qwen/Qwen3.6-27B': 'lab/Qwen3.6-27B-tiny', "
        "'z-lab/Qwen3.6-27B-DFlash': 'lab/Qwen3.6-27B-DFlash-tiny'})\n"
        f"mirrors['requirements'][{DDTREE_REQUIREMENT!r}] = "
        f"'sglang @ git+file://{sglang_repo}@refs/pull/29907/head#subdirectory=python'\n"
        "bind_address = '10.0.0.5'\n")
    (directory / "group_data" / "rtx_pro_6000_pcie.py").write_text(
        "sglang_tuning['mem_fraction_static'] = 0.8\n")
    monkeypatch.setenv("SPECFLEET_SITE", str(directory))
    return directory


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "fleet.py"
    path.write_text("rtx_pro_6000_pcie = [('gpu-1', {})]\nb200_nvlink = [('gpu-2', {'profile': 'qwen36_ddtree'})]\n")
    return path


def pin(inventory, *args, token: str = "hf_lab_granted", cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "pin.py"), str(inventory), *args], cwd=cwd,
                          capture_output=True, text=True, env={**__import__("os").environ, "HF_TOKEN": token},
                          timeout=120)


def one_line(result: subprocess.CompletedProcess) -> str:
    """pin's failure: exit 1 and one line on stderr, no traceback, nothing claimed on stdout."""
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stdout + result.stderr
    return result.stderr.strip()


def test_the_site_overrides_key_by_key_and_part_of_a_key(site, inventory):
    hosts = load_inventory(str(inventory), str(REPO))
    gpu1 = hosts["gpu-1"].data
    assert gpu1.bind_address == "10.0.0.5" and gpu1.hf_endpoint.startswith("http://127.0.0.1:")
    assert gpu1.mirrors["repos"]["moonshotai/Kimi-K2.6"] == "lab/Kimi-K2.6-tiny"
    assert gpu1.mirrors["requirements"] == {DDTREE_REQUIREMENT: gpu1.mirrors["requirements"][DDTREE_REQUIREMENT]}
    assert gpu1.sglang_tuning["mem_fraction_static"] == 0.8  # one value of the class's dict
    assert gpu1.sglang_tuning["attention_backends"]["mla"] == ("flashinfer", "flashinfer")  # the rest as shipped
    assert hosts["gpu-2"].data.sglang_tuning["mem_fraction_static"] != 0.8  # another class: its own file
    assert gpu1.profiles["kimi_k26_dflash"]["target"]["revision"] == "main" and gpu1.pins == {"repos": {}, "git": {}}


def test_a_site_inside_the_checkout_or_missing_is_refused_in_one_line(monkeypatch, inventory):
    from deployment import site_data
    monkeypatch.setenv("SPECFLEET_SITE", str(REPO / "group_data"))
    with pytest.raises(SystemExit, match="is inside the specfleet checkout"):
        site_data.directory()
    monkeypatch.setenv("SPECFLEET_SITE", "/nonexistent/site")
    with pytest.raises(SystemExit, match=r"is not a directory: create it \(mkdir -p /nonexistent/site\)"):
        site_data.directory()
    monkeypatch.delenv("SPECFLEET_SITE")
    assert site_data.directory() is None and site_data.pins() == {"repos": {}, "git": {}}


def test_pin_resolves_every_moving_revision_writes_them_for_the_deploy_and_shows_what_moved(
        site, inventory, hub, sglang_repo):
    first = pin(inventory)  # gpu-1 deploys kimi, gpu-2 qwen36_ddtree
    assert first.returncode == 0, first.stdout + first.stderr
    pins = json.loads((site / "pins.json").read_text())
    assert pins["repos"] == {"lab/Kimi-K2.6-tiny@main": hub.shas["lab/Kimi-K2.6-tiny"],
                             "lab/Kimi-K2.6-DFlash-tiny@main": hub.shas["lab/Kimi-K2.6-DFlash-tiny"],
                             "lab/Qwen3.6-27B-tiny@main": hub.shas["lab/Qwen3.6-27B-tiny"],
                             "lab/Qwen3.6-27B-DFlash-tiny@main": hub.shas["lab/Qwen3.6-27B-DFlash-tiny"]}
    head = git("rev-parse", "HEAD", cwd=sglang_repo)
    assert pins["git"] == {f"file://{sglang_repo}@refs/pull/29907/head": head}
    assert "lab/Kimi-K2.6-tiny@main" in first.stdout and first.stdout.count(" new\n") == 5
    assert "5 moving revisions pinned" in first.stdout
    url = f"file://{sglang_repo}"
    assert first.stderr.splitlines() == [
        f"pin: warning: {url}@refs/pull/29907/head is a pull request's ref, pinned at {head}, the commit its "
        f"author pushed last: its build runs that author's code on every host; read it (git fetch {url} "
        f"refs/pull/29907/head && git show {head}) before deploying"]

    # The deploy's data now carries the commits: preflight has nothing moving to refuse.
    hosts = load_inventory(str(inventory), str(REPO))
    from deployment.hosts import resolve
    qwen = resolve(hosts["gpu-2"].data, "b200_nvlink")
    assert qwen.weights.target.revision == hub.shas["lab/Qwen3.6-27B-tiny"]
    assert qwen.engine.sglang_requirement == f"sglang @ git+file://{sglang_repo}@{head}#subdirectory=python"

    # The pull request moves: the next pin says so, and says the rest did not.
    (sglang_repo / "README").write_text("two\n")
    git("commit", "-q", "-am", "two", cwd=sglang_repo)
    git("update-ref", "refs/pull/29907/head", "HEAD", cwd=sglang_repo)
    again = pin(inventory, "--profile", "qwen36_ddtree")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{git('rev-parse', 'HEAD', cwd=sglang_repo)}  moved from {head[:12]}" in again.stdout
    assert again.stdout.count(" unchanged\n") == 2 and "(1 moved)" in again.stdout
    assert len(json.loads((site / "pins.json").read_text())["repos"]) == 4  # kimi's pins kept


def test_pin_without_a_site_or_with_a_bad_ref_says_what_to_do(inventory, hub, site, sglang_repo, monkeypatch):
    git("update-ref", "-d", "refs/pull/29907/head", cwd=sglang_repo)
    missing = pin(inventory, "--profile", "qwen36_ddtree")
    assert missing.returncode == 1 and "has no ref refs/pull/29907/head" in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stderr
    monkeypatch.delenv("SPECFLEET_SITE")
    nowhere = pin(inventory)
    assert nowhere.returncode == 2 and nowhere.stderr.strip().startswith(
        "pin: the pins go to SPECFLEET_SITE/pins.json, which the deploy reads: export SPECFLEET_SITE=DIR")


def test_pin_with_a_bad_token_says_so_and_claims_nothing(site, inventory, hub):
    said = one_line(pin(inventory, "--profile", "kimi_k26_dflash", token="hf_not_a_token"))
    assert "the Hugging Face token is invalid (401 from" in said and "create a read token at" in said, said


def test_pin_with_the_hub_unreachable_says_what_it_cannot_reach(site, inventory, hub):
    with (site / "group_data" / "all.py").open("a") as extra:
        extra.write("hf_endpoint = 'http://127.0.0.1:9'\n")  # nothing listens on the discard port
    said = one_line(pin(inventory, "--profile", "kimi_k26_dflash"))
    assert said.startswith("pin: gpu-1, gpu-2: the hub at http://127.0.0.1:9 did not answer as a hub does") \
        and "check the network and hf_endpoint" in said, said


def test_pin_with_a_broken_site_file_says_which_line(site, inventory):
    (site / "group_data" / "all.py").write_text("hf_endpoint = 'https://hub.example'\nmirrors['repo'] += 1\n")
    said = one_line(pin(inventory))
    assert said.startswith(f"{site}/group_data/all.py (line 2): KeyError: 'repo': fix it"), said


def test_pin_with_a_corrupt_pins_file_says_how_to_start_it_anew(site, inventory):
    (site / "pins.json").write_text("{not json")
    said = one_line(pin(inventory))
    assert said.startswith(f"{site}/pins.json is not what pin.py writes") and "pins.json.bad" in said, said


def test_pin_refuses_a_host_in_no_class_group_naming_its_groups(site, tmp_path):
    (tmp_path / "odd.py").write_text("rtx_pro_6000 = [('gpu-1', {})]\n")
    said = one_line(pin(tmp_path / "odd.py"))
    assert said == ("pin: gpu-1: the host is in no class group (its groups: odd, rtx_pro_6000): put it in exactly "
                    "one of the inventory groups b200_nvlink, b300_nvlink, h100_sxm, h200_sxm, rtx_pro_6000_pcie, or in `gateway` "
                    "alone for a gateway without GPUs"), said


def test_pin_runs_from_outside_the_checkout(site, inventory, hub, sglang_repo, tmp_path):
    result = pin(inventory, "--profile", "qwen36_ddtree", cwd=tmp_path)
    assert result.returncode == 0 and "3 moving revisions pinned" in result.stdout, result.stdout + result.stderr
