"""Requests longer than the gateway's drain, in flight through a rolling change (rollout.py).

The gateway's drain (`DELETE /workers/{id}`) stops new requests to a worker and waits a fixed
drain_settle_secs (5 s); it does not wait for the requests in flight (smg 1.13.0). Those are the
server's to finish: SGLang 0.5.23 drains them on a SIGTERM to its main process, but its schedulers
install no SIGTERM handler, so a SIGTERM that reaches them (systemd's default KillMode=control-group
sends it to every process of the unit) kills them and every request they hold, and systemd's
default stop timeout (90 s) kills a longer generation anyway. The gateway then sends each killed
request again, from its start, to another worker (smg_worker_retries_total): the client may still
get its answer, late, after the work was done twice. The deploy's drain therefore waits until the
server holds nothing in flight (its /metrics) before the restart, whose SIGTERM reaches the main
process alone (KillMode=mixed) with a stop timeout from longest_generation_s. test_rollout.py's
requests (16 tokens) end within smg's settle time and cannot show any of this.
Like test_rollout.py, the module adds lab-gateway-1 and puts the shared lab back afterwards.
"""

import json
import re
import threading
import time
import urllib.request

import pytest

from operations.server.host_scripts.engine_answers import NO_THINKING
from tests.lab import test_rollout
from tests.lab.test_gateway import DIRECT, GATEWAY_PORT, KEY
from tests.lab.test_rollout import gateway_retries, restart_input, rollout

pytestmark = pytest.mark.lab
fleet_behind_gateway = test_rollout.fleet_behind_gateway  # the same fixture: this module's own gateway lab

# At the stand-in's pace (speed_model: 3.45 tokens a step of Kimi's DFlash at TP 8, 25 ms over the PCIe
# host's P2P, 18 ms over the B200 host's NVLink) ~150 s and ~110 s each: longer than systemd's default
# stop timeout (90 s), in flight from before the first worker's restart until after the last one's.
LONG_TOKENS = 21000


class Generation(threading.Thread):
    """One long chat completion through the gateway: `ok`, or `what` failed."""

    def __init__(self, url: str, number: int):
        super().__init__(daemon=True)
        self.url, self.number = url, number
        self.ok, self.what, self.seconds = False, "not finished", 0.0
        self.start()

    def run(self):
        ask = {"model": "kimi-k2.6", "max_tokens": LONG_TOKENS, **NO_THINKING,  # every token counted as content
               "messages": [{"role": "user", "content": f"long request {self.number}"}]}
        started = time.monotonic()
        try:
            request = urllib.request.Request(self.url, json.dumps(ask).encode(), {
                "Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
            with DIRECT.open(request, timeout=600) as response:
                answer = json.loads(response.read())
            self.ok = len(answer["choices"][0]["message"]["content"].split()) == LONG_TOKENS
            self.what = "" if self.ok else json.dumps(answer)[:200]
        except Exception as error:  # a reset connection or a timeout is a failed request too
            self.what = f"{type(error).__name__}: {error}"
        self.seconds = time.monotonic() - started


def test_a_rolling_change_lets_the_long_requests_in_flight_finish(fleet_behind_gateway, tmp_path):
    gateway, workers = fleet_behind_gateway
    url = f"http://{gateway.address}:{GATEWAY_PORT}/v1/chat/completions"
    retries = gateway_retries(gateway)
    generations = [Generation(url, number) for number in range(2 * len(workers))]
    time.sleep(2)  # all of them generating
    run, seconds = rollout(restart_input(tmp_path, "long"))
    for generation in generations:
        generation.join(600)
    failed = [g.what for g in generations if not g.ok]
    retried = gateway_retries(gateway) - retries
    drains = re.findall(r"drained from \S+ \([\d.]+ s\); the server went idle after [\d.]+ s", run.output)
    print(f"long requests through a rolling change: {len(failed)} of {len(generations)} failed {failed[:2]}, "
          f"{retried} sent again by the gateway, their seconds {sorted(round(g.seconds) for g in generations)}, "
          f"rollout {seconds:.0f} s; {drains}")
    assert run.returncode == 0, run.output[-4000:]
    assert failed == [] and retried == 0  # none even reached a stopping server
    assert min(g.seconds for g in generations) > 90  # each outlived systemd's default stop timeout
    assert len(drains) == len(workers), run.output[-4000:]  # each worker waited for its requests, then stopped
