"""SGLang is each deployment's pinned build, and the weights are the pinned revisions' files, complete,
each revision in a directory of its own.

The expected files are the hub's listing at the pinned revision, fetched the way the
deploy's preflight fetches it (operations.hub.snapshot, with the deploy's token).
"""

import posixpath

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from deployment.knobs import COMMIT
from operations.python import virtualenvs
from operations.python.virtualenvs import VenvRequirement, fingerprint
from operations.weights.download import MANIFEST
from tests.deployed.hosts import hub_snapshot

# Per weights directory: the manifest's commit and files, and each listed file's size on disk.
_WEIGHTS_SCRIPT = r"""
import json, os, sys
result = {}
for d in sys.argv[2:]:
    try:
        manifest = json.load(open(os.path.join(d, sys.argv[1])))
    except (OSError, ValueError) as error:
        result[d] = {"error": str(error)}
        continue
    disk = {}
    for path in manifest.get("files", {}):
        try:
            disk[path] = os.stat(os.path.join(d, path)).st_size
        except OSError:
            disk[path] = None
    result[d] = {"commit": manifest.get("commit"), "repo_id": manifest.get("repo_id"),
                 "files": {p: e.get("size") for p, e in manifest.get("files", {}).items()}, "disk": disk}
print(json.dumps(result))
"""


def test_sglang_virtualenv_has_the_pinned_version(target):
    for d in {dep.engine.venv: dep.replicas[0] for dep in target.deployments}.values():  # one venv per build
        check_venv(target, d)


def check_venv(target, d):
    installed = target.facts(sglang=(VenvRequirement(), dict(path=d.engine.venv, distribution="sglang")))["sglang"]
    version = (installed or {}).get("version")
    assert version, f"{target.name}: expected SGLang {d.engine.sglang_version} in {d.engine.venv}, found no sglang there"
    try:
        specifier = Requirement(d.engine.sglang_requirement).specifier
    except InvalidRequirement:
        specifier = None
    try:
        public = Version(version).public
    except InvalidVersion:
        public = version
    if specifier:  # a release pin: `sglang==0.5.23` accepts 0.5.23+lab (local labels do not count)
        ok, wanted = specifier.contains(version, prereleases=True), f"sglang{specifier}"
    else:  # a build from a URL: the version the profile says it is
        ok, wanted = public == d.engine.sglang_version, f"{d.engine.sglang_version} ({d.engine.sglang_requirement})"
    assert ok, f"{target.name}: expected SGLang {wanted} in {d.engine.venv}, found {version}"
    built_for = fingerprint(d.engine.sglang_requirement, d.engine.service.pip_index_url)
    assert installed["fingerprint"] == built_for, (
        f"{target.name}: expected {d.engine.venv} built for {d.engine.sglang_requirement} (fingerprint {built_for}), "
        f"found one built for another requirement or index (fingerprint {installed['fingerprint']})")


def test_virtualenvs_are_built_by_the_pinned_uv(target):
    d = target.deployment.replicas[0]
    uv = virtualenvs.Uv(d.engine.service.install_dir)
    host_python = target.facts(python=(virtualenvs.HostPython(), dict(uv=uv.binary)))["python"]
    if host_python["machine"] not in virtualenvs.UV_MACHINES:
        pytest.skip(f"{target.name}: no uv wheel for {host_python['machine']}: pip builds its virtualenvs")
    assert host_python["uv"] == virtualenvs.UV_VERSION, (
        f"{target.name}: expected uv {virtualenvs.UV_VERSION} at {uv.binary}, found {host_python['uv']}")
    config = target.run(f"cat {d.engine.venv}/pyvenv.cfg").stdout
    assert f"uv = {virtualenvs.UV_VERSION}" in config, f"{target.name}: expected {d.engine.venv} built by uv, found:\n{config}"


def hub_listing(target, d, repo):
    try:
        return hub_snapshot(d.hf_endpoint, target.hf_token(), repo.repo_id, repo.revision)
    except Exception as problem:  # HubProblem: the hub answered, not as the deploy needs
        pytest.fail(f"{target.name}: expected to list {repo.repo_id}@{repo.revision} on the hub "
                    f"({d.hf_endpoint or 'huggingface.co'}) to compare the weights with, found "
                    f"{type(problem).__name__}: {problem}")


def weights_state(target) -> dict:
    dirs = sorted({repo.local_dir for d in target.deployments for repo in d.weights.repos})
    return target.memo("weights", lambda: target.python(_WEIGHTS_SCRIPT, MANIFEST, *dirs))


@pytest.mark.parametrize("role", ["target", "drafter"])
def test_weights_are_the_pinned_revision_complete(target, role):
    for d in target.deployments:
        if d.weights.repo(role) is not None:  # a profile without a drafter fetches none
            check_revision(target, d.weights, d.weights.repo(role), role)


def check_revision(target, d, repo, role):
    state = weights_state(target)[repo.local_dir]
    hub = hub_listing(target, d, repo)
    where = f"{target.name}: {repo.local_dir} ({role} {repo.repo_id}@{repo.revision})"
    assert posixpath.basename(repo.local_dir) == hub.commit, (
        f"{where}: expected the revision's own directory, named after its commit {hub.commit}")
    assert "error" not in state, f"{where}: expected its manifest {MANIFEST}, found none ({state.get('error')})"
    pinned = (f"the pinned commit {hub.commit}" if COMMIT.match(repo.revision) else
              f"{hub.commit}, the commit {repo.revision} is at now (group_data pins a branch, not a commit)")
    assert state["commit"] == hub.commit, f"{where}: expected {pinned}, found the manifest's commit {state['commit']}"
    wanted = {f.path: f.size for f in hub.files}
    problems = []
    for path in sorted(set(wanted) | set(state["files"])):
        listed, on_disk = state["files"].get(path), state["disk"].get(path)
        if path not in state["files"]:
            problems.append(f"{path}: expected {wanted[path]} bytes (hub), found it missing from the manifest")
        elif path not in wanted:
            problems.append(f"{path}: expected no such file (not in the hub's listing), found it in the manifest")
        elif listed != wanted[path]:
            problems.append(f"{path}: expected {wanted[path]} bytes (hub), found {listed} in the manifest")
        elif on_disk != listed:
            problems.append(f"{posixpath.join(repo.local_dir, path)}: expected {listed} bytes (manifest and "
                            f"hub), found {'no file' if on_disk is None else f'{on_disk} bytes'} on disk")
    assert not problems, f"{where}:\n" + "\n".join(problems)
