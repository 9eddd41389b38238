"""The lab's NVIDIA repository (lab/apt_repo.py) against the deploy's package decisions
(operations/gpu/packages.py), for every OS release the deploy supports and every branch the lab
carries: what the deploy installs exists there under NVIDIA's names and versions, and what it
installs is read back as the driver it is. The lab boots Debian hosts only: the Ubuntu layouts are
checked here, not installed from."""

import re

import pytest

from lab import apt_repo
from operations.gpu import packages

BRANCHES = sorted({int(version.split(".")[0]) for version in apt_repo.DRIVER_VERSIONS})
RELEASES = sorted(packages.OS_RELEASES.values(), key=lambda release: release.repo)
CASES = [(release, branch) for release in RELEASES for branch in BRANCHES]

# NVIDIA's names of the open kernel module's package, as published: Debian's (GoogleCloudDataproc
# init actions; debian13 `nvidia-kernel-open-dkms=595.91.07-1`), Ubuntu's before 590 and from 590 on
# (NVIDIA driver installation guide, Recent Updates: `nvidia-dkms-580-open` -> `nvidia-dkms-open`).
MODULE = {("debian", 580): "nvidia-kernel-open-dkms", ("debian", 590): "nvidia-kernel-open-dkms",
          ("debian", 595): "nvidia-kernel-open-dkms", ("ubuntu", 580): "nvidia-dkms-580-open",
          ("ubuntu", 590): "nvidia-dkms-open", ("ubuntu", 595): "nvidia-dkms-open"}
# The metapackage: `nvidia-open-580` on Ubuntu before 590, `nvidia-open` otherwise.
META = {("ubuntu", 580): "nvidia-open-580"}


def debs(release):
    return {(deb.name, deb.version): deb for deb in apt_repo.release_debs(release.repo)}


def candidate(release, name, branch):
    """What apt installs for `name` under the branch's pin: its newest version of that branch."""
    versions = [deb for (found, _), deb in debs(release).items() if found == name and deb.version.startswith(f"{branch}.")]
    assert versions, f"{name} of branch {branch} is not in {release.repo}"
    return max(versions, key=lambda deb: [int(part) for part in re.findall(r"\d+", deb.version)[:3]])


def closure(release, deb, branch):
    """The package and everything it depends on (exact versions), as apt would install them."""
    found = {deb.name: deb.version}
    for dependency in deb.depends:
        name, version = re.fullmatch(r"(\S+) \(= (\S+)\)", dependency).groups()
        found |= closure(release, debs(release)[name, version], branch)
    return found


def test_the_lab_builds_every_release_the_deploy_supports():
    assert sorted(apt_repo.OS_RELEASES) == sorted(release.repo for release in RELEASES)
    assert {release.family for release in RELEASES} == set(apt_repo.OS_RELEASES.values())


@pytest.mark.parametrize("release, branch", CASES, ids=lambda value: getattr(value, "repo", str(value)))
def test_what_the_deploy_installs_is_there_and_reads_back_as_the_branchs_driver(release, branch):
    steps = packages.driver_installs(release, branch)
    names = {deb.name for deb in debs(release).values()}
    assert {name for step in steps for name in step} <= names, steps
    meta = candidate(release, steps[-1][-1], branch)
    assert meta.name == META.get((release.family, branch), "nvidia-open")
    installed = closure(release, meta, branch)
    assert MODULE[release.family, branch] in installed
    # What NvidiaPackages reads after the install: the module's version is the driver the host boots next.
    assert packages.installed_driver(installed) == meta.version.split("-")[0]
    pinning = [step for step in steps if step[0].startswith("nvidia-driver-pinning-")]
    assert bool(pinning) == (release.family == "debian" or branch >= 590)


@pytest.mark.parametrize("release", RELEASES, ids=lambda release: release.repo)
def test_versions_carry_each_releases_revisions(release):
    for deb in debs(release).values():
        if deb.name.startswith(("nvidia-open", "nvidia-dkms", "nvidia-kernel-open-dkms", "libnvidia-", "nvidia-utils")):
            revision = deb.version.split("-", 1)[1]
            assert revision in (("1",) if release.family == "debian" else ("0ubuntu1", "1ubuntu1")), deb


@pytest.mark.parametrize("release", RELEASES, ids=lambda release: release.repo)
def test_the_fabric_manager_pin_finds_the_drivers_build_under_each_releases_revision(release):
    carried = [deb.version for deb in debs(release).values() if deb.name == "nvidia-fabricmanager"]
    for driver in apt_repo.DRIVER_VERSIONS:
        [pin] = packages.fabric_packages(driver, False, {})
        name, glob = pin.split("=", 1)
        assert name == "nvidia-fabricmanager"
        # apt's version glob: a trailing * matches every version starting with what precedes it.
        assert [version for version in carried if version.startswith(glob.rstrip("*"))] == [
            apt_repo.fabric_version(release.family, driver)]
    if release.family == "ubuntu":  # the revisions differ by build there: an exact `-1` pin would miss these
        assert {version.split("-", 1)[1] for version in carried} == {"1", "1ubuntu1"}


def test_installed_at_the_drivers_version_under_any_revision_is_no_change():
    for release in RELEASES:
        for driver in apt_repo.DRIVER_VERSIONS:
            version = apt_repo.fabric_version(release.family, driver)
            assert packages.fabric_packages(driver, False, {"nvidia-fabricmanager": version}) == []
