"""The TCP listeners the stand-in engine opens are the real engine's: HTTP on --host:--port, TP rank 0's
TCPStore on --nccl-port (else a port drawn from 22000-29999), on every address as torch 2.14.1's is, and
each scheduler's Gloo device on GLOO_SOCKET_IFNAME's address (else the host name's)."""

import subprocess

from tests.lab_code.test_sglang_standin import (STANDIN_SRC, b200_gpu, children_of, dflash_args, free_port,  # noqa: F401
                                                models, run_module, start)



def listeners(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP listener of `pids` (ss -ltnpH)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        fields = line.split()
        if any(f"pid={pid}," in fields[-1] for pid in pids):
            address, _, port = fields[3].rpartition(":")
            found.add((address, int(port)))
    return found


def server_pids(proc) -> set[int]:
    return {proc.pid, *children_of(proc.pid)}


def test_the_tcpstore_listens_on_the_nccl_port_of_every_address_beside_http_on_the_host(start, models):
    nccl_port = free_port()
    s = start(dflash_args(models, "--host", "127.0.0.1", "--nccl-port", str(nccl_port), "--tp-size", "2"),
              env={"GLOO_SOCKET_IFNAME": "lo"})
    s.wait_ready()
    found = listeners(server_pids(s.proc))
    gloo = [(address, port) for address, port in found if port not in (s.port, nccl_port)]
    assert found - set(gloo) == {("127.0.0.1", s.port), ("*", nccl_port)}
    assert [address for address, _ in gloo] == ["127.0.0.1"] * 2  # one a scheduler


def test_without_nccl_port_the_store_takes_a_port_of_sglangs_random_range(start, models):
    s = start(dflash_args(models, "--host", "127.0.0.1"))
    s.wait_ready()
    (store,) = [port for address, port in listeners(server_pids(s.proc)) if address == "*"]
    assert 22000 <= store <= 29999


def test_a_taken_nccl_port_fails_the_server_as_torchs_store_does(start, models):
    first = start(dflash_args(models, "--host", "127.0.0.1", "--nccl-port", str(nccl := free_port())))
    first.wait_ready()
    proc = run_module(STANDIN_SRC, "sglang.launch_server", dflash_args(models, "--nccl-port", str(nccl),
                                                                       "--port", str(free_port())), timeout=20)
    assert proc.returncode != 0 and "DistNetworkError" in proc.stderr and "EADDRINUSE" in proc.stderr.replace(
        "Address already in use", "EADDRINUSE")


def test_torchs_store_listens_on_every_address_whatever_its_host():
    """What the stand-in copies, measured on the real torch the suite installs (tests/sglang_real.py)."""
    from tests.sglang_real import real_sglang_python

    port = free_port()
    store = subprocess.Popen([str(real_sglang_python()), "-c",
                              "import datetime, sys, time, torch.distributed as d\n"
                              f"s = d.TCPStore('127.0.0.1', {port}, 1, True, timeout=datetime.timedelta(seconds=30))\n"
                              "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert store.stdout.readline().strip() == "up"
        assert listeners({store.pid}) == {("*", port)}
    finally:
        store.kill()
        store.wait()


def test_the_random_port_range_is_the_real_engines():
    """The range SGLang 0.5.23 draws --nccl-port from (srt/utils/network.py get_free_port_below_ephemeral's
    defaults), read from the real wheel: the stand-in's and the one the layout keeps replicas out of."""
    import runpy

    from deployment.server.layout import SGLANG_RANDOM_PORTS
    from tests.sglang_real import real_sglang_python

    real = subprocess.run([str(real_sglang_python()), "-c",
                           "import inspect; from sglang.srt.utils.network import get_free_port_below_ephemeral as f\n"
                           "p = inspect.signature(f).parameters; print(p['low'].default, p['high'].default)"],
                          capture_output=True, text=True, check=True).stdout.split()
    low, high = map(int, real)
    standin = runpy.run_path(str(STANDIN_SRC / "sglang" / "srt" / "distributed.py"))["RANDOM_PORTS"]
    assert standin == (low, high) and (SGLANG_RANDOM_PORTS.start, SGLANG_RANDOM_PORTS.stop - 1) == (low, high)
