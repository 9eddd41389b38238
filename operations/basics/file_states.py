"""Several files' state in one round trip: what an idempotent upload compares against.

A file's content is known by its HMAC-SHA256 under a key made for the run (`DIGEST_KEY`), never a
plain hash: the states of the HF token and the API keys are printed at -vvv, and a plain digest there
would let anyone holding the log test guesses of the secret offline. The key stays in the
controller's memory and reaches a host only on the standard input of the command that digests
(pyinfra prints no command's stdin at any level); the fact is read with ``_stdin=DIGEST_KEY``.
"""

import hashlib
import hmac
import secrets
import shlex

from pyinfra.api import FactBase

from operations.basics.host_programs import inline

DIGEST_KEY = secrets.token_hex(32)


def sha1_of(content: bytes) -> str:
    return hashlib.sha1(content).hexdigest()


def digest_of(content: bytes) -> str:
    """What FileStates says of a file holding `content` in this run."""
    return hmac.new(DIGEST_KEY.encode(), content, hashlib.sha256).hexdigest()


class FileStates(FactBase):
    """
    Per path: None if absent, else its kind, octal mode, owner, group and (files only) digest
    (``digest_of`` its content). One command for all paths, where pyinfra's File and Sha1File facts
    take two per path. Read with ``_stdin=DIGEST_KEY`` (``gathering.read`` passes its ``stdin``).

    .. code:: python

        {"/home/sglang/.cache/huggingface/token":
            {"kind": "file", "mode": "600", "user": "sglang", "group": "sglang", "digest": "5f1d..."},
         "/etc/specfleet/api-key": None}
    """

    default = dict  # nothing printed: no path known (each reads as absent)
    host_answer = "host_facts.file_states"
    stdin = DIGEST_KEY  # its first line: the host program's key (host_facts.digest_key)

    def command(self, paths: tuple[str, ...]) -> str:
        return inline("host_facts", *paths)

    def process(self, output):
        states = {}
        for line in output:
            path, kind, *rest = line.split("|")
            states[path] = None if kind == "missing" else dict(
                kind=kind, mode=rest[0], user=rest[1], group=rest[2], digest=rest[3] or None)
        return states


class UserFileStates(FileStates):
    """
    FileStates read as `user` (for paths in that user's directories, so root follows none of its
    links); every path reads as missing while the user does not exist.

    .. code:: python

        {"/home/sglang/.cache/huggingface/token":
            {"kind": "file", "mode": "600", "user": "sglang", "group": "sglang", "digest": "5f1d..."}}
    """

    host_answer = "host_facts.user_file_states"
    host_answer_how = "fork"

    def command(self, user: str, paths: tuple[str, ...]) -> str:
        missing = "; ".join(f"echo {shlex.quote(p + '|missing')}" for p in paths)
        return (f"if id -u {shlex.quote(user)} >/dev/null 2>&1; then "
                f"runuser -u {shlex.quote(user)} -- sh -c {shlex.quote(super().command(paths))}; "
                f"else {missing}; fi")


def matches(state: dict | None, kind: str, mode: str, user: str | None = None, content: bytes | None = None) -> bool:
    """Whether a FileStates entry already is what an upload or directory operation would make it."""
    return bool(state) and state["kind"] == kind and state["mode"] == mode \
        and (user is None or (state["user"], state["group"]) == (user, user)) \
        and (content is None or state["digest"] == digest_of(content))
