"""Runs ON THE HOST (system python3, stdlib only), before a fan-out's downloads: which peers' servers answer
with the run's nonce.

    peer_answers.py SECONDS URL...   (the run's nonce on stdin)

Each URL is where a peer's server answers the nonce (sharing.nonce_url); one JSON line per URL, in order,
{"ok": true} where the answer is the nonce. A TCP connect would count whatever process holds the port (one
that took it while no peer server ran); only the nginx the run configured serves the nonce. A peer that does
not accept a connection yet (its server was started in the operation before) is asked again for up to SECONDS;
any answer other than the nonce, a redirect included (never followed), is final.
"""

import http.client
import json
import sys
import time
import urllib.error
import urllib.request


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


# Straight to the peer (no proxy from the environment: the peers are on the run's own network), no redirect.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect)


def answer(url: str, nonce: str, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with OPENER.open(url, timeout=max(1.0, deadline - time.monotonic())) as response:
                body = response.read(len(nonce) + 1)
            if body == nonce.encode():
                return {"ok": True}
            return {"ok": False, "error": "it answered something other than the run's nonce"}
        except urllib.error.HTTPError as error:
            return {"ok": False, "error": f"HTTP {error.code}"}
        except (OSError, http.client.HTTPException) as error:
            if time.monotonic() >= deadline:
                return {"ok": False, "error": f"{type(error).__name__}: {error}"}
            time.sleep(0.2)


def main(seconds: str, *urls: str) -> int:
    nonce = sys.stdin.read().strip()
    for url in urls:
        print(json.dumps(answer(url, nonce, float(seconds)) if nonce else {"ok": False, "error": "no nonce"}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
