"""The model's weights one host fetches: its profile's repos (after mirrors), where they land, who owns
them, and the hub they come from; typed, checked.

Each revision lands beside the others, as the hub cache keeps its snapshots:
`<weights_dir>/<owner>--<name>/<commit>/`, the repo named after the real one (a mirror swap keeps
the path). A server loads one revision's directory, so a unit that is put back loads the bytes it
loaded before (operations/weights/revisions.py keeps and deletes revisions).
"""

import posixpath
from dataclasses import dataclass, replace
from typing import Any

from deployment import knobs, schema

ROLES = ("target", "drafter")  # a profile names a drafter where its algorithm drafts with one


@dataclass(frozen=True)
class Repo:
    """A hub repository as this host fetches it (after mirrors), and where it lands."""

    role: str  # "target" or "drafter"
    repo_id: str
    revision: str  # a commit, or a branch that preflight resolves
    repo_dir: str  # where its revisions land, each in a directory of its own
    commit: str | None = None  # what the hub resolved `revision` to (`Weights.at_commits`)

    @property
    def local_dir(self) -> str:
        """This revision's directory (before the hub resolved a branch, named after the branch)."""
        return posixpath.join(self.repo_dir, self.commit or self.revision.replace("/", "--"))

    @property
    def unit_name(self) -> str:
        """Its download unit: one per repo on a host (a host holds one revision of a repo for its deployments)."""
        return f"specfleet-weights-{posixpath.basename(self.repo_dir)}"

    @property
    def spec_file_name(self) -> str:
        return f"weights-{posixpath.basename(self.repo_dir)}.json"


@dataclass(frozen=True)
class Weights:
    """The repos one host fetches and the settings of their downloads."""

    repos: tuple[Repo, ...]  # in ROLES order, those its profile names
    hf_endpoint: str | None  # None: the public hub
    hf_token_env: str  # the controller's variable holding the token (else its huggingface_hub token file)
    owner: str  # the download user: it owns the weights and the token, and runs the downloads
    reader: str  # the service user: the weights' group, which reads them (never the token, never writes)
    hf_home: str  # the owner's HF_HOME (the token file's directory)
    earlier_token_file: str  # where deployments without a download user kept the token (removed)
    config_dir: str  # root's directory of the download specs
    install_dir: str  # where the host programs are (the fetcher)
    verify: bool  # hash every file against the hub's hashes
    fanout: bool  # take a revision other hosts of the run deploy from them (deployment/weights/fanout.py)
    fanout_port: int  # where this host serves its revisions to its peers (operations/weights/peer.py)
    cache: bool  # keep serving them after the run: a site cache for later revisions and hosts

    def repo(self, role: str) -> Repo | None:
        """The repo of `role`; None where the profile names none (a drafter, for an algorithm without one)."""
        return next((repo for repo in self.repos if repo.role == role), None)

    @property
    def target(self) -> Repo:
        return self.repo("target")

    @property
    def drafter(self) -> Repo | None:
        """The drafter's repo; None where the profile's algorithm drafts without one (AR among them)."""
        return self.repo("drafter")

    @property
    def local_dirs(self) -> tuple[str, str | None]:
        """The target's and the drafter's revision directories (None without a drafter): what a server loads."""
        return self.target.local_dir, self.drafter.local_dir if self.drafter else None

    @property
    def commits(self) -> dict[str, str]:
        """The commit of each role the hub resolved (`at_commits`)."""
        return {r.role: r.commit for r in self.repos if r.commit is not None}

    def at_commits(self, commits: dict[str, str]) -> "Weights":
        """These weights at the commits the hub resolved (per role); a role without one stays as it was."""
        return replace(self, repos=tuple(replace(r, commit=commits.get(r.role, r.commit)) for r in self.repos))


def _mirrored(mirrors: dict, repo_id: str, revision: str) -> tuple[str, str]:
    replacement = mirrors.get("repos", {}).get(repo_id)
    if not replacement:
        return repo_id, revision
    mirror_id, _, mirror_revision = replacement.partition("@")
    return mirror_id, mirror_revision or revision


def pinned_revision(pins: dict, repo_id: str, revision: str) -> str:
    """The commit `pins` (group data `pins`: {"repos": {"REPO@REVISION": COMMIT}}) holds for a moving revision,
    else the revision."""
    found = pins.get("repos", {}).get(f"{repo_id}@{revision}")
    if found is None or knobs.COMMIT.fullmatch(revision):
        return revision
    return knobs.matching(f"pins repos {repo_id}@{revision}", found, knobs.COMMIT, "a 40-hex commit")


def repo_dir(weights_dir: str, real_id: str) -> str:
    """Where a repo's revisions land: named after the real repo, so a mirror swap keeps paths stable."""
    return posixpath.join(weights_dir, real_id.replace("/", "--"))


def token_env(data: Any) -> str:
    """The controller's variable holding the HF token (`hf_token_env`), checked."""
    return schema.value(data, "hf_token_env")


def resolve(data: Any, profile_name: str, profile: dict, weights_dir: str, hf_token_env: str, owner: str, reader: str,
            hf_home: str, earlier_token_file: str, config_dir: str, install_dir: str) -> Weights:
    """The weights of `profile` for a host, from its data; a bad value raises BadHostData."""
    mirrors = data.mirrors or {}
    pins = getattr(data, "pins", None) or {}

    def repo(role: str) -> Repo:
        real_id = knobs.matching(f"profiles[{profile_name!r}][{role!r}]['repo']", profile[role]["repo"],
                                 knobs.REPO_ID, "a hub repo id, owner/name")
        repo_id, revision = _mirrored(mirrors, real_id, profile[role]["revision"])
        revision = pinned_revision(pins, repo_id, revision)
        return Repo(role,
                    knobs.matching(f"{role} repo (mirrors)", repo_id, knobs.REPO_ID, "a hub repo id, owner/name"),
                    knobs.matching(f"{role} revision", revision, knobs.REVISION,
                                   "a 40-hex commit (or a branch or tag name)"),
                    repo_dir(weights_dir, real_id),
                    revision if knobs.COMMIT.fullmatch(revision) else None)

    return Weights(
        repos=tuple(repo(role) for role in ROLES if role in profile),
        hf_endpoint=schema.value(data, "hf_endpoint"),
        hf_token_env=hf_token_env,
        owner=owner,
        reader=reader,
        hf_home=hf_home,
        earlier_token_file=earlier_token_file,
        config_dir=config_dir,
        install_dir=install_dir,
        verify=schema.value(data, "verify_weights"),
        fanout=schema.value(data, "weights_fanout"),
        fanout_port=schema.value(data, "weights_fanout_port"),
        cache=schema.value(data, "weights_cache"),
    )
