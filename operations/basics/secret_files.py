"""Secrets on a host (the Hugging Face token, API keys): files created with their final mode.

Neither secret is ever an operation or fact argument (pyinfra prints those at -v, pyinfra#1148),
nor content given to files.put (`pyinfra --diff` prints that): each operation reads its secret
from the controller's environment inside its body and hands it to one host command on standard
input (the connector's `_stdin`, which no log level prints). That command writes a temporary
file under umask 077 and renames it into place, so the file never exists with a looser mode and
a link planted at its name is replaced, never followed.

Root never writes in a directory the service user owns: the token, which lives in the service
user's HF_HOME, is written by the service user itself (runuser); the API key lives in the
root-owned config directory, root-owned and readable by the service user's group only.
"""

import os
import re

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand

from operations.basics import gathering
from operations.basics.failing import fail_host
from operations.basics.file_states import FileStates, matches

# Letters, digits and `-._~+/=` (hex, base64 and URL-safe base64 keys): nothing a shell, a unit
# file or a log escapes beyond the few forms the launcher masks. 16 characters at least.
API_KEY = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")
API_KEY_MODE = "640"  # root:<service group>: the launcher (service user) reads it, cannot replace it

# Writes stdin (its trailing newline dropped) to "$1/$2" (mode "$3", group "$4"), under umask 077
# from its first byte, through a temporary file renamed into place.
_WRITE_NEW_FILE = ('t=$(mktemp "$1/.$2.XXXXXX") && '
                   '{ tr -d "\\n" > "$t" && chmod "$3" "$t" && chgrp "$4" "$t" && mv -f "$t" "$1/$2"; } '
                   '|| { rm -f "$t"; exit 1; }')


def write_secret(secret: str, directory: str, name: str, mode: str, group: str,
                 as_user: str | None = None) -> StringCommand:
    """The command writing `secret` (given on its stdin) to directory/name, as root or as `as_user`."""
    if as_user:
        # The service user's own directory: it creates it (and its parents) and the file itself.
        runner = ["runuser", "-u", as_user, "--", "sh", "-c"]
        script = 'umask 077 && mkdir -p "$1" && chmod 700 "$1" && ' + _WRITE_NEW_FILE
    else:
        runner, script = ["sh", "-c"], "umask 077 && " + _WRITE_NEW_FILE
    return StringCommand(*runner, QuoteString(script), "secret", *map(QuoteString, (directory, name, mode, group)),
                         _stdin=secret)


# A new key from the host's own CSPRNG (64 hex digits), through _WRITE_NEW_FILE: never on the controller,
# never in a command line.
_GENERATE_NEW_FILE = "umask 077 && python3 -c 'import secrets; print(secrets.token_hex(32))' | { " + _WRITE_NEW_FILE + "; }"


def host_key_file(path: str, group: str):
    """
    The commands (an operation's body) making `path` a key generated on the host itself, root's, mode
    0640, group `group`; a key already there is kept (its owner and mode put right).
    """
    directory, name = path.rsplit("/", 1)
    state = gathering.read(FileStates, paths=(path,)).get(path)
    if not state or state["kind"] != "file":
        yield StringCommand("sh", "-c", QuoteString(_GENERATE_NEW_FILE), "secret",
                            *map(QuoteString, (directory, name, API_KEY_MODE, group)))
    elif matches(state, "file", API_KEY_MODE) and (state["user"], state["group"]) == ("root", group):
        host.noop(f"{path} holds the host's key (0{API_KEY_MODE}, root:{group})")
    else:
        yield StringCommand("chown", QuoteString(f"root:{group}"), QuoteString(path), "&&",
                            "chmod", API_KEY_MODE, QuoteString(path))


def controller_key_file(key_env: str, path: str, group: str, remove: bool):
    """
    The commands (an operation's body) making `path` the controller's API key in `key_env`, root's,
    mode 0640, group `group`: written from stdin when it differs. Without the variable the host
    keeps its key; only `remove` removes it. Never the key itself in a message.
    """
    key = os.environ.get(key_env, "")
    directory, name = path.rsplit("/", 1)
    state = gathering.read(FileStates, paths=(path,)).get(path)
    if not key:
        if state and remove:
            yield StringCommand("rm", "-f", QuoteString(path))
        else:
            host.noop(f"no ${key_env} on the controller: {path} "
                      + ("kept (remove_api_key=true removes it)" if state else "absent, the server has no key"))
        return
    if not API_KEY.fullmatch(key):
        # Never the key itself: only what is wrong with it.
        yield fail_host([f"{host.name}: ${key_env} must be 16 to 512 characters of letters, digits and "
                         f"-._~+/= (e.g. `openssl rand -hex 32`), found {len(key)} characters that are not"],
                        static=True)
        return
    if matches(state, "file", API_KEY_MODE, content=key.encode()) and \
            (state["user"], state["group"]) == ("root", group):
        host.noop(f"{path} holds the key (0{API_KEY_MODE}, root:{group})")
        return
    yield write_secret(key, directory, name, API_KEY_MODE, group)
