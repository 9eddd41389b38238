"""Runs ON THE HOST (system python3, stdlib only): one request to an SGLang server of this host, its body
to stdout. The serving benchmark reads and resets the servers it measures with it.

    server_request.py PORT PATH METHOD SERVICE_USER [KEY_FILE]

With KEY_FILE (a deployed unit's API key), the key is read here, never an argument, and sent only over
a connection whose server end SERVICE_USER owns: while the server is down, any local user may bind
its port, and must not receive the key. A redirect is not followed. An error exits 1 with one line.
"""

import http.client
import pwd
import sys
from pathlib import Path

from owned_sockets import LOOPBACK, OwnedConnection


def request(port: int, path: str, method: str, service_user: str, key_file: str = "") -> str:
    key = Path(key_file).read_text().strip() if key_file and Path(key_file).is_file() else ""
    connection = OwnedConnection(LOOPBACK, port, pwd.getpwnam(service_user).pw_uid, 60, whose=service_user)
    try:
        connection.request(method, path, body=b"" if method == "POST" else None,
                           headers={"Authorization": f"Bearer {key}"} if key else {})
        response = connection.getresponse()
        body = response.read().decode(errors="replace")
    finally:
        connection.close()
    if response.status >= 300:
        raise OSError(f"HTTP {response.status} {response.reason} ({path})")
    return body


def main(port: str, path: str, method: str, service_user: str, key_file: str = "") -> None:
    try:
        print(request(int(port), path, method, service_user, key_file))
    except (OSError, KeyError, http.client.HTTPException) as error:
        raise SystemExit(f"{method} {path} on port {port}: {error}")


if __name__ == "__main__":
    main(*sys.argv[1:6])
