"""Controller-side Hugging Face Hub checks for preflight: token, access, revision, sizes.

These run on the controller (where the token is) before any host is changed, once per run for all hosts.
Nothing here prints or logs the token. The token is checked with a plain request (hub_requests.py). A pinned
commit's listing and config.json cannot change: huggingface_hub's client reads them once, and the controller
keeps them (hub_cache.py); a run that finds them kept asks the hub only whether the token may read each repo's
files, with a plain request too, and imports no client (about 190 modules, 0.18 s of a no-op's imports on the
lab's controller: speed/README.md, P1). The client is imported where it is asked, not with this module, so
uninstall.py, bench.py and a gateway's deploy never import it either.
"""

import functools
import json
import os
import sys
import tempfile
import threading
from dataclasses import dataclass, replace
from urllib.parse import quote

from deployment import knobs
from deployment.knobs import COMMIT
from operations.weights import hub_cache
from operations.weights.host_scripts.weights_manifest import entry_problem
from operations.weights.hub_requests import HubOutage, asked

TOKENS_PAGE = "https://huggingface.co/settings/tokens"
PUBLIC_HUB = "https://huggingface.co"


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


_client_importing = threading.Lock()


def client_imported() -> None:
    """huggingface_hub's client imported by one thread at a time: two threads importing one package at once
    can meet a module the other has half imported."""
    with _client_importing:
        import huggingface_hub.errors  # noqa: F401
        import huggingface_hub.file_download  # noqa: F401
        import huggingface_hub.hf_api  # noqa: F401


def hub_outages() -> tuple[type[Exception], ...]:
    """What asking the hub raises when it is down or broken: no connection, a timeout, a 5xx. The client's own
    errors count where it was imported (an error of a module never imported cannot have been raised)."""
    if "huggingface_hub" not in sys.modules:
        return (OSError,)
    with _client_importing:
        import httpx2
        from huggingface_hub.errors import HfHubHTTPError
    return httpx2.HTTPError, HfHubHTTPError, OSError


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


def hub_url(endpoint: str | None) -> str:
    """The hub asked for ENDPOINT (hf_endpoint, which the weights' config checked): it, else the controller's
    HF_ENDPOINT as huggingface_hub reads it, checked as hf_endpoint is, else the public hub. The token goes
    to it, so a plain-HTTP or malformed HF_ENDPOINT raises HubProblem, and nothing is sent.

    **Example:** ``hub_url(None)`` is ``"https://huggingface.co"`` without HF_ENDPOINT.
    """
    if endpoint:
        return endpoint.rstrip("/")
    variable = os.environ.get("HF_ENDPOINT")
    if not variable:
        return PUBLIC_HUB
    try:
        checked = knobs.url("HF_ENDPOINT", variable)
    except knobs.BadHostData:  # not a URL, or one with credentials
        checked = None
    if checked is None or not checked.startswith("https://"):
        raise HubProblem(f"the controller's HF_ENDPOINT={knobs.without_userinfo(variable)!r} is no https:// URL "
                         "without credentials, and the token would go to it: fix or unset it (or name the hub in "
                         "hf_endpoint, where allow_http_hub=true trusts plain HTTP)")
    return checked.rstrip("/")


def refusal(code: str | None, where: str, repo_id: str, revision: str) -> HubProblem | None:
    """What the hub's refusal of a repo's request means, by its X-Error-Code (a plain request's header, or the
    error huggingface_hub raised for it: ``client_refusal``), in one sentence with the fix; None for a code no
    refusal of a repo has."""
    if code == "GatedRepo":
        return AccessPending(f"the token has no access to the gated repo {repo_id}: accept its terms at "
                             f"{where}/{repo_id} (logged in as the token's user), then re-run")
    if code == "RevisionNotFound":
        return HubProblem(f"{repo_id} has no revision {revision}: fix the revision in group_data")
    if code == "RepoNotFound":
        return HubProblem(f"{repo_id} does not exist at {where} (or is private to another account): fix the "
                          "repo id in group_data")
    return None


def client_refusal(error: Exception, where: str, repo_id: str, revision: str) -> Exception:
    """What a huggingface_hub error means: the ``refusal`` of the X-Error-Code it stands for (the client also
    takes a bare 401 from an https hub for a missing repo), else the error itself, an outage."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
    kinds = ((GatedRepoError, "GatedRepo"),  # a missing repo's error too: first
             (RevisionNotFoundError, "RevisionNotFound"), (RepositoryNotFoundError, "RepoNotFound"))
    code = next((code for kind, code in kinds if isinstance(error, kind)), None)
    return refusal(code, where, repo_id, revision) or error


@once_per_run
def whoami(endpoint: str | None, token: str | None) -> str:
    """The name of the token's user, as the hub knows it (a plain request: no client is imported for it)."""
    if not token:
        raise HubProblem(f"no Hugging Face token on the controller: create a read token at "
                         f"{TOKENS_PAGE} and export HF_TOKEN (or run `hf auth login`)")
    where = hub_url(endpoint)
    answer = asked("GET", f"{where}/api/whoami-v2", token)
    if answer.status == 401:
        raise HubProblem(f"the Hugging Face token is invalid (401 from {where}): "
                         f"create a read token at {TOKENS_PAGE} and export HF_TOKEN")
    try:
        name = json.loads(answer.body)["name"] if answer.status == 200 else None
    except (ValueError, KeyError, TypeError):
        name = None
    if not isinstance(name, str):
        raise HubProblem(f"cannot check the token at {where}: {where}/api/whoami-v2 answered {answer.status}"
                         f"{' and no user' if answer.status == 200 else ''}")
    return name


@once_per_run
def repo_snapshot(endpoint: str | None, token: str | None, repo_id: str, revision: str) -> RepoSnapshot:
    """The repo at `revision` as ``snapshot`` answers it, the token allowed to download it. A pinned commit's
    listing and config come from the controller once kept (``kept``), and only the access is asked of the hub."""
    where = hub_url(endpoint)
    known = kept(endpoint, repo_id, revision)
    if known is not None:
        return granted(where, token, known, revision)
    snap = snapshot(endpoint, token, repo_id, revision)
    if COMMIT.fullmatch(revision):
        hub_cache.write(where, repo_id, snap.commit, {"endpoint": where, "repo_id": repo_id, "commit": snap.commit,
                                                     "files": snap.listing(), "config": snap.config})
    return snap


def kept(endpoint: str | None, repo_id: str, revision: str) -> RepoSnapshot | None:
    """What the controller kept of the pinned commit REVISION, checked as the hub's own answer is; None for a
    branch, or where nothing kept is such an answer (then the hub is asked, and its answer kept)."""
    if not COMMIT.fullmatch(revision):
        return None
    where = hub_url(endpoint)
    answer = hub_cache.read(where, repo_id, revision)
    if not isinstance(answer, dict) or (answer.get("endpoint"), answer.get("repo_id")) != (where, repo_id):
        return None
    try:
        files = tuple(RepoFile(f["path"], f["size"], f["sha256"], f["git_sha1"]) for f in answer["files"])
        snap = checked(RepoSnapshot(repo_id, answer["commit"], files, answer["config"]), revision, where)
    except (KeyError, TypeError, HubProblem):
        return None
    # What snapshot() reads: a config that is an object, from a file the listing holds.
    return snap if isinstance(snap.config, dict) and "config.json" in {f.path for f in files} else None


def granted(where: str, token: str | None, known: RepoSnapshot, revision: str) -> RepoSnapshot:
    """KNOWN, once the hub says the token may download it now. Gated repos show their listing to anyone; only a
    file tells: the HEAD of config.json the client sends before downloading it, whose redirect (to a CDN) is
    the file served."""
    url = f"{where}/{quote(known.repo_id)}/resolve/{known.commit}/config.json"
    answer = asked("HEAD", url, token)
    if 200 <= answer.status < 400:
        return checked(replace(known, commit=answer.commit), revision, where) if answer.commit else known
    raise refusal(answer.error_code, where, known.repo_id, revision) or HubOutage(f"{answer.status} from {url}")


@once_per_run
def snapshot(endpoint: str | None, token: str | None, repo_id: str, revision: str) -> RepoSnapshot:
    """The repo's commit, files and config at `revision`, asked of huggingface_hub's client, checking that the
    token may download it."""
    client_imported()
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError
    where = hub_url(endpoint)
    api = HfApi(endpoint=where, token=token)
    try:
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
        files = tuple(
            RepoFile(s.rfilename, s.size or 0, s.lfs.sha256 if s.lfs else None, None if s.lfs else s.blob_id)
            for s in info.siblings or []
        )
        # Checked before its commit names anything, even the scratch download below.
        listed = checked(RepoSnapshot(repo_id, info.sha, files, {}), revision, where)
        # Gated repos show their listing to anyone; only the files tell whether access was granted.
        with tempfile.TemporaryDirectory() as scratch:
            config_path = hf_hub_download(repo_id, "config.json", revision=info.sha, token=token,
                                          endpoint=where, cache_dir=scratch)
            with open(config_path) as config_file:
                config = json.load(config_file)
    except HfHubHTTPError as error:
        raise client_refusal(error, where, repo_id, revision) from None
    return RepoSnapshot(repo_id, listed.commit, listed.files, config)


def commit_of(endpoint: str | None, token: str | None, repo_id: str, revision: str) -> str:
    """The commit `revision` of `repo_id` points at now (pin.py), checked as the deploy checks a snapshot's."""
    client_imported()
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError
    where = hub_url(endpoint)
    try:
        info = HfApi(endpoint=where, token=token).model_info(repo_id, revision=revision)
    except HfHubHTTPError as error:
        raise client_refusal(error, where, repo_id, revision) from None
    return checked(RepoSnapshot(repo_id, info.sha, (), {}), revision, where).commit


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
