"""Several files' state in one round trip: what an idempotent upload compares against."""

import hashlib
import shlex

from pyinfra.api import FactBase


def sha1_of(content: bytes) -> str:
    return hashlib.sha1(content).hexdigest()


class FileStates(FactBase):
    """
    Per path: None if absent, else its kind, octal mode, owner, group and (files only) sha1.
    One command for all paths, where pyinfra's File and Sha1File facts take two per path.

    .. code:: python

        {"/home/sglang/.cache/huggingface/token":
            {"kind": "file", "mode": "600", "user": "sglang", "group": "sglang", "sha1": "5f1d..."},
         "/etc/specfleet/api-key": None}
    """

    default = dict  # nothing printed: no path known (each reads as absent)
    host_answer = "host_facts.file_states"

    def command(self, paths: tuple[str, ...]) -> str:
        return (
            f"for p in {' '.join(map(shlex.quote, paths))}; do "
            'if [ -f "$p" ]; then echo "$p|file|$(stat -c \'%a|%U|%G\' "$p")|$(sha1sum < "$p" | cut -d\' \' -f1)"; '
            'elif [ -d "$p" ]; then echo "$p|directory|$(stat -c \'%a|%U|%G\' "$p")|"; '
            'else echo "$p|missing"; fi; done'
        )

    def process(self, output):
        states = {}
        for line in output:
            path, kind, *rest = line.split("|")
            states[path] = None if kind == "missing" else dict(
                kind=kind, mode=rest[0], user=rest[1], group=rest[2], sha1=rest[3] or None)
        return states


class UserFileStates(FileStates):
    """
    FileStates read as `user` (for paths in that user's directories, so root follows none of its
    links); every path reads as missing while the user does not exist.

    .. code:: python

        {"/home/sglang/.cache/huggingface/token":
            {"kind": "file", "mode": "600", "user": "sglang", "group": "sglang", "sha1": "5f1d..."}}
    """

    host_answer = "host_facts.user_file_states"
    host_answer_how = "fork"

    def command(self, user: str, paths: tuple[str, ...]) -> str:
        missing = "; ".join(f"echo {shlex.quote(p + '|missing')}" for p in paths)
        return (f"if id -u {shlex.quote(user)} >/dev/null 2>&1; then "
                f"runuser -u {shlex.quote(user)} -- sh -c {shlex.quote(super().command(paths))}; "
                f"else {missing}; fi")


def matches(state: dict | None, kind: str, mode: str, user: str | None = None, sha1: str | None = None) -> bool:
    """Whether a FileStates entry already is what an upload or directory operation would make it."""
    return bool(state) and state["kind"] == kind and state["mode"] == mode \
        and (user is None or (state["user"], state["group"]) == (user, user)) \
        and (sha1 is None or state["sha1"] == sha1)
