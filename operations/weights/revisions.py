"""The revisions of each repo a host keeps: the wanted one, the one before it while the disk allows,
none other; each deletion said.

Each revision lives in a directory of its own (deployment/weights/config.py), so a replica rolled
back to its previous unit loads its previous bytes. Once every replica of the host serves the
wanted revisions, the revisions no unit loads are pruned: the newest of them (the previous) is kept
while the filesystem still has room for one more revision of the wanted one's size (what the next
switch downloads at most), the others are deleted, as the download user who owns them.
"""

import json
import posixpath

from pyinfra import host
from pyinfra.api import FactBase, operation

from deployment.server.config import ServiceHost
from deployment.weights.config import Repo, Weights
from operations.basics import gathering
from operations.basics.host_programs import inline
from operations.server.unit import ServerUnits
from operations.weights.checks import gb


class WeightsRevisions(FactBase):
    """
    Per repo directory, the free bytes of its filesystem and its revisions: each one's commit, bytes,
    bytes no other revision links, whether complete, when its manifest was written
    (host_scripts/weights_revisions.py).

    .. code:: python

        {"free": {"/srv/specfleet/models/Qwen--Qwen3.6-27B": 636707266560},
         "revisions": {"/srv/specfleet/models/Qwen--Qwen3.6-27B": {
             "/srv/specfleet/models/Qwen--Qwen3.6-27B/486dd6...": {"commit": "486dd6...", "bytes": 53800000000,
                                                                   "own_bytes": 53800000000, "complete": True,
                                                                   "time": 1764590000.0}}}}
    """

    host_answer = "weights_revisions.answer"

    def command(self, repo_dirs: tuple[str, ...]) -> str:
        return inline("weights_revisions", "list", *repo_dirs)

    def process(self, output):
        return json.loads("\n".join(output))


def repos_of(weights: tuple[Weights, ...]) -> list[Repo]:
    """Every repo of the host's deployments, each once (a host holds one revision of a repo)."""
    return list({repo.repo_dir: repo for w in weights for repo in w.repos}.values())


def plan(repos: list[Repo], found: dict, loaded: set[str]) -> tuple[dict[str, list[str]], list[str]]:
    """(per repo directory, the revisions to delete; a sentence per revision kept or deleted).

    `found` is WeightsRevisions; `loaded`, the weights directories the host's SGLang units load."""
    deletions: dict[str, list[str]] = {}
    said = []
    for repo in repos:
        revisions = (found.get("revisions") or {}).get(repo.repo_dir) or {}
        free = (found.get("free") or {}).get(repo.repo_dir, 0)
        wanted = revisions.get(repo.local_dir) or {}
        others = sorted((d for d in revisions if d != repo.local_dir and d not in loaded),
                        key=lambda d: revisions[d]["time"], reverse=True)
        previous = next((d for d in others if revisions[d]["complete"]), None)  # the newest complete one
        for directory in others:
            r = revisions[directory]
            name = (f"{r.get('repo_id') or posixpath.basename(repo.repo_dir)} revision "
                    f"{r['commit'] or posixpath.basename(directory)} ({directory})")
            if directory == previous and free >= wanted.get("bytes", 0):
                said.append(f"kept the previous {name}, {gb(r['own_bytes'])} of its own: the disk has room for "
                            f"another revision ({gb(free)} free)")
                continue
            why = ("an incomplete revision" if not r["complete"] else
                   "an older revision than the previous one" if directory != previous else
                   f"the disk has no room for another revision beside it ({gb(free)} free, "
                   f"{gb(wanted.get('bytes', 0))} a revision)")
            deletions.setdefault(repo.repo_dir, []).append(directory)
            said.append(f"deleted {name}, {gb(r['own_bytes'])} freed: {why}")
    return deletions, said


@operation()
def pruned(weights: tuple[Weights, ...], service: ServiceHost):
    """
    Keep each repo's wanted revision and, while the disk allows, the previous one; delete the revisions
    no SGLang unit of the host loads beyond those, as the download user, saying which and why. Runs once
    every replica serves the wanted revisions (a host that failed readiness keeps all of them).

    + weights: the weights of each of the host's deployments
    + service: the host's servers' settings (their unit prefix, for the units' weights directories)

    **Example:**

    .. code:: python

        revisions.pruned(name="Weights revisions", weights=tuple(d.weights for d in deployments),
                          service=worker.service)
    """
    repos = repos_of(weights)
    found: dict = {"free": {}, "revisions": {}}
    for w in weights:  # as each deployment's gathering asked
        answer = gathering.read(WeightsRevisions, repo_dirs=tuple(r.repo_dir for r in w.repos)) or {}
        for key in found:
            found[key].update(answer.get(key) or {})
    units = gathering.read(ServerUnits, prefix=service.service_prefix) or {}
    loaded = {directory for unit in units.values() for directory in unit["loads"]}
    deletions, said = plan(repos, found, loaded)
    for sentence in said:
        host.log_styled(f"{host.name}: weights: {sentence}", fg="yellow" if sentence.startswith("deleted") else "green")
    if not deletions:
        host.noop(f"no weights revision to delete ({len(repos)} repos)")
        return
    owner = weights[0].owner
    for repo_dir, directories in deletions.items():
        yield inline("weights_revisions", "delete", repo_dir, *directories, user=owner)


@gathering.wants
def _read(deployment) -> gathering.Wanted:
    return [(WeightsRevisions, dict(repo_dirs=tuple(r.repo_dir for r in deployment.weights.repos)))]
