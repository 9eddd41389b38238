"""Pin every moving revision of the profiles an inventory deploys to the commit it points at now.

    python pin.py inventory/ct200.py                            # the profiles its hosts deploy
    python pin.py inventory/ct200.py --profile qwen36_ddtree    # these profiles instead (repeatable)

For each host serving a model, the target's and drafter's revisions (after `mirrors`) that are not a
commit are asked of the hub, with the controller's token, as preflight asks; a git requirement's ref
(the DDTree build's pull request) is asked with `git ls-remote`. Each is shown beside what it was
pinned to before (new, unchanged, moved) and written to SPECFLEET_SITE/pins.json, which the deploy
reads (group data `pins`): preflight then passes, and the deploy fetches and installs those commits
until the next pin. A later run shows what moved since. Options --data and --group-data are pyinfra's.
"""

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent
COMMIT_LENGTH = 40


class Asked:
    """A host's data as pin asks it: `profile` as chosen, no pins (what the revisions are, unpinned)."""

    def __init__(self, data, **values):
        self._data, self._values = data, values

    def __getattr__(self, key: str):
        return self._values[key] if key in self._values else getattr(self._data, key)

    def get(self, key: str, default=None):
        return self._values[key] if key in self._values else self._data.get(key, default)


def moving(hosts, profiles: list[str] | None) -> tuple[dict, dict, list[str]]:
    """What the inventory's workers would deploy unpinned: ({(endpoint, token variable, repo, revision)},
    {(url, ref)}, problems), revisions and refs that are not commits only."""
    from deployment.hosts import host_class_of, resolve
    from deployment.knobs import COMMIT, BadHostData
    from deployment.roles import is_gateway, serves_model
    from deployment.nodes.group import members
    from deployment.server.config import git_refs

    repos, refs, problems = {}, {}, []
    for host in hosts:
        if not serves_model(host.groups) and is_gateway(host.groups):
            continue  # a gateway without GPUs; a host in no group at all is refused by host_class_of
        for profile in profiles or [host.data.profile]:
            try:
                d = resolve(Asked(host.data, profile=profile, pins={}), host_class_of(host.groups),
                            members(hosts, host))
            except BadHostData as problem:
                problems.append(f"{host.name}: {problem}")
                continue
            w = d.weights
            for repo in w.repos:
                if not COMMIT.fullmatch(repo.revision):
                    repos.setdefault((w.hf_endpoint, w.hf_token_env, repo.repo_id, repo.revision), []).append(host.name)
            for url, ref in git_refs(d.engine.sglang_requirement):
                if not COMMIT.fullmatch(ref):
                    refs.setdefault((url, ref), []).append(host.name)
    return repos, refs, problems


def ls_remote(url: str, ref: str) -> str:
    """The commit `ref` names in the git repository at `url` now (`git ls-remote`): the ref itself, else
    the branch, else the tag (its peeled commit)."""
    try:
        listed = subprocess.run(["git", "ls-remote", "--", url, ref, f"refs/heads/{ref}", f"refs/tags/{ref}",
                                 f"refs/tags/{ref}^{{}}"], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise LookupError("git is not installed on the controller: install it (apt install git), then re-run") \
            from None
    except subprocess.TimeoutExpired:
        raise LookupError(f"git ls-remote {url} did not answer within 120 s: check the network") from None
    if listed.returncode:
        raise LookupError(f"git ls-remote {url} {ref} failed: {' '.join(listed.stderr.split())[:300]}")
    found = dict(reversed(line.split("\t", 1)) for line in listed.stdout.splitlines() if "\t" in line)
    for name in (ref, f"refs/heads/{ref}", f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}"):
        commit = found.get(name, "")
        if len(commit) == COMMIT_LENGTH and all(c in "0123456789abcdef" for c in commit):
            return commit
    raise LookupError(f"{url} has no ref {ref} (git ls-remote lists none): fix the requirement in group_data")


def pull_request_warning(url: str, ref: str, commit: str) -> str | None:
    """One line when `ref` is a pull request's: its commit is whatever the request's author pushed last."""
    if not ref.startswith("refs/pull/"):
        return None
    return (f"pin: warning: {url}@{ref} is a pull request's ref, pinned at {commit}, the commit its author pushed "
            f"last: its build runs that author's code on every host; read it (git fetch {url} {ref} && git show "
            f"{commit}) before deploying")


def outcome(before: str | None, now: str) -> str:
    if before is None:
        return "new"
    return "unchanged" if before == now else f"moved from {before[:12]}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python pin.py", description=__doc__.split("\n\n")[0],
                                     usage="python pin.py INVENTORY [--profile NAME]... [--data KEY=VALUE]... "
                                           "[--group-data DIR]...")
    parser.add_argument("inventory")
    parser.add_argument("--profile", action="append", default=[], help="pin this profile (default: each host's)")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE", help="as pyinfra's --data")
    parser.add_argument("--group-data", action="append", default=[], metavar="DIR", help="as pyinfra's --group-data")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(REPO))  # inventories and group data import the repository's packages, as pyinfra's CLI does
    importlib.import_module("pyinfra_cli")  # first: it patches the process for gevent, before anything opens SSL
    from deployment import site_data
    from operations.weights.checks import outage, token_problem
    from operations.weights.hub import HubProblem, commit_of, controller_token, hub_outages, hub_url

    where = site_data.pins_path()
    if where is None:
        print(f"pin: the pins go to {site_data.SITE_ENV}/{site_data.PINS_FILE}, which the deploy reads: export "
              f"{site_data.SITE_ENV}=DIR (your site directory, outside this checkout), then re-run", file=sys.stderr)
        return 2
    hosts = inventory_hosts(args.inventory, args.data, args.group_data)
    repos, refs, problems = moving(hosts, args.profile)
    pins = site_data.pins()
    # hubs: (endpoint, token variable) -> what stops the token there ("" if nothing), asked once.
    rows, warnings, hubs = [], [], {}
    for (endpoint, token_env, repo_id, revision), names in sorted(repos.items(), key=str):
        key, token, hub = f"{repo_id}@{revision}", controller_token(token_env), (endpoint, token_env)
        if hub not in hubs:  # a bad token or an unreachable hub said once, as the deploy's preflight says it
            hubs[hub] = token_problem(endpoint, token)
            if hubs[hub]:
                users = sorted({name for (e, t, *_), each in repos.items() if (e, t) == hub for name in each})
                problems.append(f"{', '.join(users)}: {hubs[hub]}")
        if hubs[hub]:
            continue
        try:
            commit = commit_of(endpoint, token, repo_id, revision)
        except HubProblem as error:
            problems.append(f"{', '.join(names)}: {key}: {error}")
            continue
        except hub_outages() as error:
            problems.append(f"{', '.join(names)}: {key}: {outage(hub_url(endpoint), error)}")
            continue
        rows.append((key, commit, outcome(pins["repos"].get(key), commit)))
        pins["repos"][key] = commit
    for (url, ref), names in sorted(refs.items()):
        key = f"{url}@{ref}"
        try:
            commit = ls_remote(url, ref)
        except LookupError as error:
            problems.append(f"{', '.join(names)}: {error}")
            continue
        rows.append((key, commit, outcome(pins["git"].get(key), commit)))
        pins["git"][key] = commit
        if warning := pull_request_warning(url, ref, commit):
            warnings.append(warning)
    width = max((len(key) for key, _, _ in rows), default=0)
    for key, commit, said in rows:
        print(f"pin: {key:{width}}  {commit}  {said}")
    for line in warnings:
        print(line, file=sys.stderr)
    for problem in problems:
        print(f"pin: {problem}", file=sys.stderr)
    if rows:
        site_data.write_pins(pins)
    moved = sum(1 for *_, said in rows if said.startswith("moved"))
    if rows or not problems:
        print(f"pin: {len(rows)} moving revisions pinned in {where} ({moved} moved)" if rows else
              "pin: nothing moving to pin: every revision of these profiles is a commit")
    return 1 if problems else 0


def inventory_hosts(path: str, data: list[str], group_data: list[str]) -> list:
    """The inventory's hosts with their data, as `pyinfra PATH ...` run from the checkout loads them; a key no
    knob has stops pin (deployment/schema.py), as it stops the deploy."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    from deployment import schema

    override = schema.cli_data(data)
    state = State()
    state.cwd = str(REPO)  # the shipped group_data/, from any directory
    with ctx_state.use(state):  # pyinfra reads an inventory file inside a state, as its CLI does
        inventory = make_inventory(path, override_data=override, cwd=str(REPO),
                                   group_data_directories=group_data or None)
    schema.check_inventory(inventory)
    return list(inventory)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
