"""Weights by revision: the host program listing and deleting revisions, the plan of what a host keeps,
and the disk check's credit for files another revision holds (facts in, decisions out)."""

import hashlib
import os

from deployment.hosts import at_commits, resolve
from operations.weights import revisions
from operations.weights.checks import disk_problems
from operations.weights.hub import RepoFile, RepoSnapshot
from pyinfra.context import ctx_host
from tests.helpers import host_programs_importable
from tests.unit.fakehost import FakeHost, run
from tests.unit.group_data import host_data

host_programs_importable()
import weights_disk  # noqa: E402
import weights_manifest  # noqa: E402
import weights_revisions  # noqa: E402

OLD, NEW, OLDEST = "a" * 40, "b" * 40, "c" * 40


def entry(path: str, data: bytes) -> dict:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "git_sha1": None}


def revision(directory, files: dict[str, bytes], commit: str, link_from=None) -> list[dict]:
    directory.mkdir(parents=True, exist_ok=True)
    for path, data in files.items():
        if link_from and (link_from / path).is_file() and (link_from / path).read_bytes() == data:
            os.link(link_from / path, directory / path)
        else:
            (directory / path).write_bytes(data)
    listing = [entry(p, d) for p, d in files.items()]
    weights_manifest.write(directory, "org/model", commit, listing)
    return listing


def test_the_host_program_lists_revisions_with_the_bytes_each_frees_and_deletes_only_revisions(tmp_path):
    repo = tmp_path / "org--model"
    revision(repo, {"config.json": b"{}", "model.safetensors": b"x" * 1000}, OLDEST)  # the single directory
    revision(repo / OLD, {"config.json": b"{}", "model.safetensors": b"y" * 1000}, OLD)
    revision(repo / NEW, {"config.json": b"{}", "model.safetensors": b"z" * 1000}, NEW, link_from=repo / OLD)
    (repo / "notes").mkdir()  # not a revision: never listed, never deleted
    found = weights_revisions.listing([str(repo)])["revisions"][str(repo)]
    assert set(found) == {str(repo), str(repo / OLD), str(repo / NEW)}
    manifest_bytes = os.path.getsize(repo / OLD / weights_manifest.MANIFEST)
    assert found[str(repo / OLD)]["bytes"] == 1002 + manifest_bytes  # a revision directory's every file
    assert found[str(repo / NEW)]["own_bytes"] == found[str(repo / NEW)]["bytes"] - 2  # config.json is linked
    assert found[str(repo)]["commit"] == OLDEST and found[str(repo)]["bytes"] == 1002  # its manifest's files
    assert weights_revisions.delete(str(repo), [str(repo), str(repo / "notes"), "/etc"]) == [str(repo)]
    assert sorted(os.listdir(repo)) == sorted([OLD, NEW, "notes"])
    assert weights_revisions.delete(str(repo), [str(repo / OLD)]) == [str(repo / OLD)]
    assert (repo / NEW / "config.json").read_bytes() == b"{}"  # its link survives


def test_the_host_program_lists_the_directory_the_controller_lays_each_revision_in(tmp_path):
    """The host's rule (a revision directory is named by its commit) is the controller's Repo.local_dir."""
    d, laid = repos(weights_dir=str(tmp_path))
    for repo in laid:
        revision(tmp_path / repo.local_dir.removeprefix(f"{tmp_path}/"), {"config.json": b"{}"}, repo.commit)
        assert weights_revisions.revision_dirs(repo.repo_dir) == [repo.local_dir]


def repos(**data):
    d = at_commits(resolve(host_data("rtx_pro_6000_pcie", profile="qwen36_ddtree", **data), "rtx_pro_6000_pcie"),
                   {"target": NEW, "drafter": NEW})
    return d, revisions.repos_of((d.weights,))


def found(repo_dir: str, free: int, **dirs) -> dict:
    return {"free": {repo_dir: free}, "revisions": {repo_dir: {
        f"{repo_dir}/{commit}" if commit != "single" else repo_dir:
            {"repo_id": "Qwen/Qwen3.6-27B", "commit": commit, "bytes": 54_000, "own_bytes": own, "complete": complete, "time": time}
        for commit, (own, complete, time) in dirs.items()}}}


def test_the_previous_revision_is_kept_while_the_disk_has_room_for_another_and_older_ones_are_deleted():
    d, [target, _] = repos()
    revs = found(target.repo_dir, 60_000, **{NEW: (54_000, True, 30), OLD: (54_000, True, 20),
                                            "single": (54_000, True, 0), "e" * 40: (10, False, 25)})
    deletions, said = revisions.plan([target], revs, loaded=set())
    assert deletions == {target.repo_dir: [f"{target.repo_dir}/{'e' * 40}", target.repo_dir]}
    assert said[0].startswith(f"deleted Qwen/Qwen3.6-27B revision {'e' * 40}") and "an incomplete revision" in said[0]
    assert said[1].startswith(f"kept the previous Qwen/Qwen3.6-27B revision {OLD}")
    assert "an older revision than the previous one" in said[2]
    # No room for another revision beside it: the previous one goes too, saying why.
    deletions, said = revisions.plan([target], found(target.repo_dir, 50_000, **{NEW: (54_000, True, 30),
                                                                                  OLD: (54_000, True, 20)}), set())
    assert deletions == {target.repo_dir: [f"{target.repo_dir}/{OLD}"]}
    assert "the disk has no room for another revision beside it" in said[0]
    # A revision a unit still loads (a replica rolled back to it) is never a candidate.
    deletions, _ = revisions.plan([target], found(target.repo_dir, 0, **{NEW: (54_000, True, 30),
                                                                         OLD: (54_000, True, 20)}),
                                  loaded={f"{target.repo_dir}/{OLD}"})
    assert deletions == {}


def test_the_prune_deletes_as_the_download_user_and_a_host_holding_only_what_it_keeps_is_a_noop():
    d, repos_ = repos()
    target = repos_[0]
    revs = found(target.repo_dir, 0, **{NEW: (54_000, True, 30), OLD: (54_000, True, 20)})
    facts = {revisions.WeightsRevisions: revs, revisions.ServerUnits: {}}
    commands, _ = run(revisions.pruned, facts, weights=(d.weights,), service=d.host.service)
    assert len(commands) == 1 and commands[0].startswith("runuser -u sglang-download -- python3 -c ")
    assert commands[0].endswith(f"delete {target.repo_dir} {target.repo_dir}/{OLD}")
    facts[revisions.WeightsRevisions] = found(target.repo_dir, 0, **{NEW: (54_000, True, 30)})
    commands, noops = run(revisions.pruned, facts, weights=(d.weights,), service=d.host.service)
    assert commands == [] and noops == ["no weights revision to delete (2 repos)"]


def test_the_disk_check_refuses_a_linked_revision_directory_and_looks_only_inside_the_others(tmp_path):
    """The service user owns the repo directory: a revision swapped for a link to / is not walked by root."""
    repo = tmp_path / "org--model"
    (repo / OLD / "sub").mkdir(parents=True)
    revision(repo / OLD, {"config.json": b"{}", "sub/model.safetensors": b"y" * 1000}, OLD)
    repo.joinpath(NEW).symlink_to("/")
    assert weights_disk.disk(str(repo / NEW)) == {"linked": True}
    d, _ = repos()
    local_dir = d.weights.target.local_dir
    snap = RepoSnapshot("org/model", NEW, (RepoFile("config.json", 2, "e" * 64, None),), {})
    with ctx_host.use(FakeHost({})):
        assert disk_problems([(d.weights, {"target": snap})], {local_dir: {"linked": True}}) == [
            f"host-1: {local_dir} is a link, not the revision directory the deploy makes (the service user owns "
            "the directory holding it): remove the link, then re-run (the fetch makes the directory again)"]
    elsewhere = tmp_path / "root-only"
    (repo / OLD / "sub").rename(elsewhere)
    (repo / OLD / "sub").symlink_to(elsewhere)  # a file of the recorded size, reached through a linked directory
    repo.joinpath(NEW).unlink()
    assert weights_disk.disk(str(repo / NEW))["others"] == [f"sha256:{entry('config.json', b'{}')['sha256']}:2"]


def test_the_disk_check_counts_only_what_no_other_revision_holds(tmp_path):
    repo = tmp_path / "org--model"
    revision(repo / OLD, {"config.json": b"{}", "model.safetensors": b"y" * 1000}, OLD)
    disk = weights_disk.disk(str(repo / NEW))
    config, shard = entry("config.json", b"{}"), entry("model.safetensors", b"y" * 1000)
    assert disk["files"] == {} and disk["others"] == sorted(
        f"sha256:{e['sha256']}:{e['size']}" for e in (config, shard))
    d, _ = repos()
    snap = RepoSnapshot("org/model", NEW, (RepoFile("config.json", 2, config["sha256"], None),
                                          RepoFile("model.safetensors", 1000, "f" * 64, None)), {})
    local_dir = d.weights.target.local_dir
    tiny = {local_dir: {**disk, "free": 1500}}
    with ctx_host.use(FakeHost({})):
        # The shard changed (another sha256): 1000 bytes + the same as headroom, of 1500 free.
        [problem] = disk_problems([(d.weights, {"target": snap})], tiny)
        assert "need 0.0 GB (1000 bytes) more" in problem
        unchanged = RepoSnapshot("org/model", NEW, (RepoFile("config.json", 2, config["sha256"], None),
                                                    RepoFile("model.safetensors", 1000, shard["sha256"], None)), {})
        assert disk_problems([(d.weights, {"target": unchanged})], tiny) == []
