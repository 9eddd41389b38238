"""Plain requests to a hub, with the standard library: the token's and a file's checks without the hub client.

A no-op asks the hub two things a pinned commit's listing cannot say: whether the token is known, and whether
it may read a gated repo's files. Asked here, not through huggingface_hub, whose client a no-op would import
for them (about 190 modules, 0.18 s of its imports on the lab's controller: speed/README.md, P1). The hub is
reached as the client reaches it: through the environment's proxies and NO_PROXY (urllib's ``getproxies``,
which httpx2 reads too), trusting the certificates httpx2 trusts, and never in HF_HUB_OFFLINE mode. A
redirect is the answer, never followed, so the token goes to the hub alone. Nothing here prints, logs or
raises the token.
"""

import http.client
import os
import platform
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass

TIMEOUT_S = 10  # the client's for a file's metadata HEAD (HF_HUB_ETAG_TIMEOUT's default)
BODY_LIMIT = 1 << 16  # a whoami answer is ~0.5 kB; what a hub sends beyond this is not read
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")  # the client's (constants.HF_HUB_OFFLINE)


class HubOutage(OSError):
    """No answer a hub gives: none at all, a broken one, or a status that no refusal explains (a 5xx)."""


@dataclass(frozen=True)
class Answer:
    """What the hub said: its status, the headers that say why, and a short body."""

    status: int
    error_code: str | None  # X-Error-Code: RepoNotFound, GatedRepo, RevisionNotFound, EntryNotFound
    commit: str | None  # X-Repo-Commit: the commit a file was resolved at
    body: bytes


class _Unfollowed(urllib.request.HTTPRedirectHandler):
    """A 3xx is the answer: following it would carry the Authorization header to wherever it points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def tls_context() -> ssl.SSLContext:
    """The certificates huggingface_hub's transport trusts (httpcore2's default_ssl_context): SSL_CERT_FILE or
    SSL_CERT_DIR, else the system's store, through truststore on macOS and Windows (whose Pythons may ship no
    CA file of their own)."""
    if os.environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    if os.environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    if platform.system() in ("Windows", "Darwin"):
        import truststore  # huggingface_hub's transport depends on it there
        return truststore.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    return ssl.create_default_context()


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set as the client reads it: it then reaches no hub."""
    return any((os.environ.get(name) or "").upper() in ("1", "ON", "YES", "TRUE") for name in OFFLINE_VARIABLES)


def asked(method: str, url: str, token: str | None) -> Answer:
    """The hub's answer to METHOD URL with the token (if any), whatever its status; HubOutage (an OSError)
    when none came.

    **Example:** ``asked("HEAD", f"{hub}/{repo}/resolve/{commit}/config.json", token).status`` is 200 once
    the token may read the repo, 403 with ``error_code`` GatedRepo while its terms wait.
    """
    if offline():
        raise HubOutage(f"cannot reach {url}: offline mode is enabled (HF_HUB_OFFLINE)")
    try:
        request = urllib.request.Request(url, method=method, headers={
            "User-Agent": "specfleet", **({"Authorization": f"Bearer {token}"} if token else {})})
    except ValueError as error:  # a URL that names no HTTP server
        raise HubOutage(f"{url}: {error}") from None
    handlers = [_Unfollowed()]
    if url.startswith("https://"):
        handlers.append(urllib.request.HTTPSHandler(context=tls_context()))
    try:
        with urllib.request.build_opener(*handlers).open(request, timeout=TIMEOUT_S) as response:
            return _answer(response.status, response.headers, response.read(BODY_LIMIT))
    except urllib.error.HTTPError as refused:  # a status >= 300: an answer, not an outage
        with refused:
            return _answer(refused.code, refused.headers, refused.read(BODY_LIMIT))
    except urllib.error.URLError as error:
        # The cause (refused, timed out, no such name), not urllib's wrapper around it.
        raise (error.reason if isinstance(error.reason, OSError) else HubOutage(str(error.reason))) from None
    except http.client.HTTPException as error:  # a broken answer: bad status line, cut body
        raise HubOutage(f"{type(error).__name__} from {url}: {error}") from None
    except ValueError:
        pass  # http.client's refusal of a header value quotes it: the token. Raised below, not even as a context
    raise HubOutage(f"the token holds a character no HTTP header carries (a line break?): it was not sent to {url}")


def _answer(status: int, headers, body: bytes) -> Answer:
    return Answer(status, headers.get("X-Error-Code"), headers.get("X-Repo-Commit"), body)
