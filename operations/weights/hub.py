"""Controller-side Hugging Face Hub checks for preflight: token, access, revision, sizes.

These run on the controller (where the token is) before any host is changed,
once per run for all hosts. Nothing here prints or logs the token. huggingface_hub is imported where
the hub is asked, not with this module: its client is ~380 modules and 0.2-0.5 s of a run on the lab's
controller, which uninstall.py, bench.py and a gateway's deploy never use.
"""

import functools
import json
import os
import tempfile
import threading
from dataclasses import dataclass

from operations.basics.knobs import COMMIT
from operations.basics.untrusted import printable
from operations.weights.host_scripts.weights_manifest import entry_problem

TOKENS_PAGE = "https://huggingface.co/settings/tokens"


class HubProblem(Exception):
    """A preflight failure with its cause and fix in the message."""


class AccessPending(HubProblem):
    """The token's user has not been granted a gated repo yet (its terms page is in the message)."""


@dataclass(frozen=True)
class RepoFile:
    path: str
    size: int
    sha256: str | None  # LFS files: the hub's sha256 of the content
    git_sha1: str | None  # other files: the git blob id

    def entry(self) -> dict:
        """As a listing entry (host_scripts/weights_manifest.py): what the host-side programs read."""
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "git_sha1": self.git_sha1}


@dataclass(frozen=True)
class RepoSnapshot:
    repo_id: str
    commit: str
    files: tuple[RepoFile, ...]
    config: dict

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def weight_bytes(self) -> int:
        return sum(f.size for f in self.files if f.path.endswith(".safetensors"))

    def listing(self) -> list[dict]:
        return [f.entry() for f in self.files]

    def text_config(self) -> dict:
        """Multimodal wrappers (Kimi K2.6: model_type kimi_k25) nest the language model's config."""
        return self.config.get("text_config") or self.config


def controller_token(env_name: str) -> str | None:
    """The token from the controller's environment, else its huggingface_hub token file."""
    if os.environ.get(env_name):
        return os.environ[env_name]
    from huggingface_hub import get_token
    return get_token()


def client_imported() -> None:
    """huggingface_hub's client imported by the calling thread, before threads that ask the hub start: two
    threads importing one package at once can meet a module the other has half imported."""
    import huggingface_hub.errors  # noqa: F401
    import huggingface_hub.file_download  # noqa: F401
    import huggingface_hub.hf_api  # noqa: F401


def once_per_run(function):
    """functools.cache for the hosts' deploy.py, which pyinfra runs side by side (a greenlet each): a call
    made while the same call is under way waits for its answer instead of asking the hub again, as
    functools.cache would (a no-op of 3 hosts asked the hub the same 7 requests 3 times). A failure is
    not kept, as functools.cache keeps none: the next call asks again."""
    answers: dict = {}
    locks: dict = {}
    guard = threading.Lock()

    @functools.wraps(function)
    def cached(*args):
        with guard:
            lock = locks.setdefault(args, threading.Lock())
        with lock:
            if args not in answers:
                answers[args] = function(*args)
            return answers[args]

    return cached


def _endpoint_url(endpoint: str | None) -> str:
    return (endpoint or "https://huggingface.co").rstrip("/")


@once_per_run
def whoami(endpoint: str | None, token: str | None) -> str:
    if not token:
        raise HubProblem(f"no Hugging Face token on the controller: create a read token at "
                         f"{TOKENS_PAGE} and export HF_TOKEN (or run `hf auth login`)")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError
    try:
        return HfApi(endpoint=endpoint, token=token).whoami()["name"]
    except HfHubHTTPError as error:
        if error.response is not None and error.response.status_code == 401:
            raise HubProblem(f"the Hugging Face token is invalid (401 from {_endpoint_url(endpoint)}): "
                             f"create a read token at {TOKENS_PAGE} and export HF_TOKEN") from None
        raise HubProblem(f"cannot check the token at {_endpoint_url(endpoint)}: {printable(error)}") from None


@once_per_run
def snapshot(endpoint: str | None, token: str | None, repo_id: str, revision: str) -> RepoSnapshot:
    """The repo's commit, files and config at `revision`, checking that the token may download it."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
    api = HfApi(endpoint=endpoint, token=token)
    page = f"{_endpoint_url(endpoint)}/{repo_id}"
    try:
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
        files = tuple(
            RepoFile(s.rfilename, s.size or 0, s.lfs.sha256 if s.lfs else None, None if s.lfs else s.blob_id)
            for s in info.siblings or []
        )
        # Checked before its commit names anything, even the scratch download below.
        listed = checked(RepoSnapshot(repo_id, info.sha, files, {}), revision, _endpoint_url(endpoint))
        # Gated repos show their listing to anyone; only the files tell whether access was granted.
        with tempfile.TemporaryDirectory() as scratch:
            config_path = hf_hub_download(repo_id, "config.json", revision=info.sha, token=token,
                                          endpoint=endpoint, cache_dir=scratch)
            with open(config_path) as config_file:
                config = json.load(config_file)
    except GatedRepoError:
        raise AccessPending(f"the token has no access to the gated repo {repo_id}: accept its terms at "
                         f"{page} (logged in as the token's user), then re-run") from None
    except RevisionNotFoundError:
        raise HubProblem(f"{repo_id} has no revision {revision}: fix the revision in group_data") from None
    except RepositoryNotFoundError:
        raise HubProblem(f"{repo_id} does not exist at {_endpoint_url(endpoint)} (or is private to "
                         "another account): fix the repo id in group_data") from None
    return RepoSnapshot(repo_id, listed.commit, listed.files, config)


def commit_of(endpoint: str | None, token: str | None, repo_id: str, revision: str) -> str:
    """The commit `revision` of `repo_id` points at now (pin.py), checked as the deploy checks a snapshot's."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError
    try:
        info = HfApi(endpoint=endpoint, token=token).model_info(repo_id, revision=revision)
    except RevisionNotFoundError:
        raise HubProblem(f"{repo_id} has no revision {revision}: fix the revision in group_data") from None
    except RepositoryNotFoundError:
        raise HubProblem(f"{repo_id} does not exist at {_endpoint_url(endpoint)} (or is private to "
                         "another account): fix the repo id in group_data") from None
    return checked(RepoSnapshot(repo_id, info.sha, (), {}), revision, _endpoint_url(endpoint)).commit


def checked(snap: RepoSnapshot, revision: str, where: str) -> RepoSnapshot:
    """SNAP, once its commit and file names are safe to put in a unit file, a path and a shell line.

    The commit is 40 hex digits, and the pinned one when the revision is a commit; every file
    name is relative, without '..', control characters or a leading '/'; sizes and hashes are
    well formed. Anything else is a hostile or broken hub: refused, before any host changes.
    """
    distrust = f"{where} answered for {snap.repo_id}@{revision}"
    if not (isinstance(snap.commit, str) and COMMIT.fullmatch(snap.commit)):
        raise HubProblem(f"{distrust} the commit {snap.commit!r}, which is not 40 hex digits: refusing to "
                         "deploy from it (check hf_endpoint and the mirror)")
    if COMMIT.fullmatch(revision) and snap.commit != revision:
        raise HubProblem(f"{distrust} another commit, {snap.commit}: refusing to deploy anything but the "
                         "pinned commit (check hf_endpoint and the mirror)")
    problems = [problem for entry in snap.listing() if (problem := entry_problem(entry))]
    if problems:
        raise HubProblem(f"{distrust} a file listing specfleet will not write to disk "
                         f"({'; '.join(problems[:3])}): refusing it (check hf_endpoint and the mirror)")
    return snap
