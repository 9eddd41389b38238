"""Parsers and validators of knob values: what a value from group data, the inventory or --data may look like.

Each takes the knob's name (for the message) and its value, and returns the value parsed or raises
BadHostData, one line naming the knob, its value and what is accepted (`refused` words it; deploy.py
puts the host in front). `deployment.hosts.resolve()`
applies them before any host is touched, so nothing unchecked reaches a shell, a unit file or a path.
"""

import ipaddress
import posixpath
import re
from typing import Any
from urllib.parse import urlsplit

from deployment.network import LOOPBACK


class BadHostData(ValueError):
    """Host data that cannot be deployed; the message is one line naming the knob, its value and what is accepted."""


def refused(name: str, value: Any, fix: str, wrong: str = "is not accepted") -> BadHostData:
    """A knob's refusal, one line: `NAME=VALUE WRONG: FIX` (what is wrong with the value, how to fix it).

    `value` is shown as repr: pass it masked where it may hold a secret (``without_userinfo``)."""
    return BadHostData(f"{name}={value!r} {wrong}: {fix}")


COMMIT = re.compile(r"[0-9a-f]{40}")  # a pinned revision or git commit; anything else is a branch or tag
# What a value may look like before it reaches a shell, a unit file or a path (whole values:
# `matching` uses fullmatch, so no trailing newline slips through a `$`).
SAFE_PATH = re.compile(r"(/[A-Za-z0-9._-]+)+")
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")  # useradd's portable names
UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # rendered into the unit file's first line
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
ARGUMENT = re.compile(r"[A-Za-z0-9._:/=,+@%-]+")  # one word of SGLang's command line
ENV_VALUE = re.compile(r"[A-Za-z0-9 ._:/=,+@%-]*")
VERSION = re.compile(r"\d+(\.\d+)*([.+][A-Za-z0-9.]+)?")
REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._:/=<>!~,+@#%-]*")  # PEP 508, a path or a URL
BACKEND = re.compile(r"[a-z0-9_]+")


def boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
    if str(value).strip().lower() not in words:
        raise refused(name, value, "use true/false, yes/no or 1/0", wrong="is not a boolean")
    return words[str(value).strip().lower()]


def integer(name: str, value: Any, minimum: int = 0, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not re.fullmatch(r"\s*\d+\s*", str(value)) or int(value) < minimum \
            or (maximum is not None and int(value) > maximum):
        limits = f"from {minimum} to {maximum}" if maximum is not None else f"at least {minimum}"
        raise BadHostData(f"{name}={value!r} is not a whole number {limits}")
    return int(value)


def fraction(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if isinstance(value, bool) or not 0 < number <= 1:
        raise refused(name, value, "use a number above 0 and at most 1", wrong="is not a fraction")
    return number


def number(name: str, value: Any, minimum: float = 0.0) -> float:
    try:
        parsed = float(value)
    except (TypeError, ValueError):
        parsed = None
    if isinstance(value, bool) or parsed is None or not parsed >= minimum:
        raise BadHostData(f"{name}={value!r} is not a number of at least {minimum:g}")
    return parsed


def matching(name: str, value: Any, pattern: re.Pattern, accepted: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value) or ".." in value.split("/"):
        raise refused(name, value, f"use {accepted}")
    return value


def path(name: str, value: Any) -> str:
    if isinstance(value, str) and posixpath.normpath(value) != value:
        raise refused(name, value, f"use e.g. {posixpath.normpath(posixpath.join('/', value))!r}",
                      wrong="is not a normalized absolute path")
    return matching(name, value, SAFE_PATH, "an absolute path of letters, digits and ._- (e.g. /srv/specfleet)")


# Credentials in a URL: any user[:password]@ of an http(s) URL (a token often rides as the user
# name), a password in any other (git+ssh://git@host names a user, not a secret).
_USERINFO = re.compile(r"(https?://)[^/?#\s]*@|(://)[^/?#\s@]*:[^/?#\s@]*@")


def without_userinfo(text: str) -> str:
    """`text` with the credentials of every URL in it masked (for a message: the value itself is refused)."""
    return _USERINFO.sub(lambda m: f"{m.group(1) or m.group(2)}***@", text)


def _credentials_refused(name: str, value: str, where: str) -> None:
    """A URL's user:password@ would reach root's command lines, -v output and unit files."""
    if _USERINFO.search(value):
        raise refused(name, without_userinfo(value), f"use {where} without user:password@ (credentials go in "
                      "root's ~/.netrc on the host, which pip, uv and git read)")


def url(name: str, value: Any) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value) if isinstance(value, str) else None
    if not parts or parts.scheme not in ("http", "https") or not parts.hostname \
            or not re.fullmatch(r"[A-Za-z0-9._~:/?#\[\]@%=+,-]+", value):
        shown = without_userinfo(value) if isinstance(value, str) else value
        raise refused(name, shown, "use an http(s) URL such as https://host/path, or None")
    _credentials_refused(name, value, "the URL")
    return value


def url_over_https(name: str, value: Any, allow_name: str, allow: Any, what: str) -> str | None:
    """`url(name, value)`, https unless the boolean knob `allow_name` trusts plain HTTP (`what` says what
    travels unprotected then)."""
    checked = url(name, value)
    if checked is not None and checked.startswith("http://") and not boolean(allow_name, allow):
        raise refused(name, without_userinfo(checked),
                      f"use an https:// URL, or set {allow_name}=true to trust plain HTTP ({what})")
    return checked


def requirement(name: str, value: Any, accepted: str) -> str:
    """A pip requirement on one line (PEP 508, a path or a URL), with no credentials in its URL."""
    if isinstance(value, str):
        _credentials_refused(name, value, "a requirement whose URL is")
    return matching(name, value, REQUIREMENT, accepted)


def address(name: str, value: Any) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise refused(name, value, f"use e.g. {LOOPBACK} (loopback), or the host's address on the serving network",
                      wrong="is not an IP address") from None


def networks(name: str, values: Any) -> tuple[str, ...]:
    """IP networks (an address, or an address/prefix), each as ipaddress writes it; `any` for every address."""
    if not isinstance(values, (list, tuple)):
        raise refused(name, values, "use a list of IP networks, e.g. ['10.0.5.0/24'], or ['any']", wrong="is not a list")
    found = []
    for value in values:
        if value == "any":
            found += ["0.0.0.0/0", "::/0"]
            continue
        try:
            found.append(str(ipaddress.ip_network(value, strict=False)))
        except (TypeError, ValueError):
            raise refused(name, value, "use an IP address, an address/prefix (10.0.5.0/24) or any",
                          wrong="is not an IP network") from None
    return tuple(dict.fromkeys(found))


def names(name: str, values: Any, pattern: re.Pattern, accepted: str) -> tuple[str, ...]:
    if not isinstance(values, (list, tuple)):
        raise refused(name, values, f"use a list of {accepted}", wrong="is not a list")
    return tuple(matching(name, value, pattern, accepted) for value in values)


def arguments(name: str, values: Any, owned: dict[str, str]) -> tuple[str, ...]:
    """Extra command-line words (ARGUMENT each), none of them an option the deploy sets itself.

    `owned` maps each such option (every spelling) to the knob that sets it. An option is refused
    as itself, as --option=value, and as any abbreviation argparse would expand to it (argparse
    takes the last of repeated options, so an extra --host would override the deploy's).
    """
    words = names(name, values, ARGUMENT, "single words (letters, digits, ._:/=,+@%-)")
    for word in words:
        option = word.split("=", 1)[0]
        if not option.startswith("--") or option == "--":
            continue
        taken = sorted(flag for flag in owned if flag.startswith(option))
        if taken:
            raise refused(name, list(values), f"use {owned[taken[0]]} for {taken[0]}, which the deploy sets "
                          f"itself ({word} would override it)")
    return words


def service_account(name: str, value: Any) -> str:
    """A user name for a service's own system user: never root (the deploy would lock root's login
    by giving it no shell, and run the service with every privilege)."""
    user = matching(name, value, USER_NAME, "a user name ([a-z_][a-z0-9_-], at most 32)")
    if user == "root":
        raise refused(name, value, "use a user of the service's own, not root (the deploy creates it as a system "
                      "user without a login shell)")
    return user


def environment(name: str, values: Any) -> dict[str, str]:
    if not isinstance(values, dict):
        raise refused(name, values, "use dict(NAME='value')", wrong="is not a dict")
    return {matching(f"{name} key", key, ENV_NAME, "a variable name ([A-Za-z_][A-Za-z0-9_]*)"):
            matching(f"{name}[{key!r}]", str(value), ENV_VALUE, "letters, digits, spaces and ._:/=,+@%-")
            for key, value in values.items()}


def levels(name: str, value: Any) -> tuple[int, ...]:
    """A comma-separated list of positive whole numbers (e.g. concurrency levels), sorted, each once."""
    items = str(value).replace(" ", "").split(",")
    return tuple(sorted({integer(f"{name} (in {value!r})", item, minimum=1, maximum=99999) for item in items}))
