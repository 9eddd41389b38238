"""python -m lab up [--hosts SPEC] [--bare HOST,...] [--os bookworm|trixie] | status | down | gpu HOST PROFILE
| ask [--key ENV] [--model NAME] [MESSAGE]"""

import argparse
import json
import os
import urllib.request

import lab
from lab import fleet, rootfs
from lab.config import HUB_URL, INDEX_URL

GATEWAY_PORT = 30080  # group_data/gateway.py gateway_port
STATUS_COLUMNS = ("host", "address", "class", "GPU profile", "Debian", "state")


def ask(message: str, model: str, key: str) -> str:
    """One chat completion through the lab's gateway, said with what answered it: the lab's engine is a
    stand-in, whose words are deterministic filler, not a model's."""
    gateway = next((h for h in fleet.read_fleet() if h.host_class == "gateway"), None)
    if gateway is None:
        raise SystemExit("lab: no gateway host; boot one with `python -m lab up --hosts pcie=1,b200=1,gateway=1`")
    url = f"http://{gateway.address}:{GATEWAY_PORT}/v1/chat/completions"
    body = {"model": model, "messages": [{"role": "user", "content": message}], "max_tokens": 16,
            "chat_template_kwargs": {"thinking": False}}
    request = urllib.request.Request(url, json.dumps(body).encode(), {
        "Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the lab's network, never a proxy
    try:
        answer = json.load(opener.open(request, timeout=60))
    except OSError as error:
        raise SystemExit(f"lab: the gateway at {url} did not answer: {error}") from None
    choice, usage = answer["choices"][0], answer.get("usage") or {}
    return (f"one completion through the gateway ({url}, model {answer.get('model', model)}), written by the LAB "
            "STAND-IN engine (deterministic filler words, not a model's text):\n"
            f"  {choice['message']['content']!r}\n"
            f"  ({usage.get('completion_tokens', '?')} tokens, finish_reason {choice.get('finish_reason')})")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="build (once) and boot the lab; idempotent")
    up.add_argument("--hosts", default=fleet.DEFAULT_SPEC,
                    help=f"hosts per class, e.g. pcie=2,b200=1,b300=1 (default {fleet.DEFAULT_SPEC})")
    up.add_argument("--bare", default="", metavar="HOST[,HOST]",
                    help="hosts booted now start as freshly imaged machines: no driver, no NVIDIA repository")
    up.add_argument("--os", default=rootfs.DEFAULT_SUITE, choices=rootfs.SUITES,
                    help="the Debian release hosts booted now run (its root is built once per machine)")
    commands.add_parser("status", help="each host, its address, class and state")
    question = commands.add_parser("ask", help="one chat completion through the lab's gateway, labelled")
    question.add_argument("message", nargs="?", default="hello")
    question.add_argument("--model", default="kimi-k2.6", help="the served model name (default kimi-k2.6)")
    question.add_argument("--key", default="SPECFLEET_API_KEY", metavar="ENV",
                          help="the variable holding the clients' API key (default SPECFLEET_API_KEY)")
    commands.add_parser("down", help="stop and remove every host and lab server")
    gpu = commands.add_parser("gpu", help="switch a host's GPU stand-in profile, or `no-driver`")
    gpu.add_argument("host")
    gpu.add_argument("profile")
    args = parser.parse_args()

    if args.command == "up":
        hosts = lab.up(args.hosts, bare=set(args.bare.split(",")), suite=args.os)
        print(f"lab: {len(hosts)} hosts up; hub {HUB_URL}, index {INDEX_URL}; "
              "deploy with `pyinfra lab/inventory.py deploy.py`")
    elif args.command == "status":
        status = lab.status()
        rows = [STATUS_COLUMNS, *((h["name"], h["address"], h["host_class"], h["gpu_profile"], h["suite"], h["state"])
                                  for h in status["hosts"])]
        widths = [max(len(str(row[i])) for row in rows) for i in range(len(STATUS_COLUMNS))]
        for row in rows:
            print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
        print("services:", json.dumps(status["services"]))
    elif args.command == "ask":
        print(ask(args.message, args.model, os.environ.get(args.key, "")))
    elif args.command == "down":
        lab.down()
    elif args.command == "gpu":
        host = next((h for h in fleet.read_fleet() if h.name == args.host), None)
        if host is None:
            raise SystemExit(f"lab: no host {args.host}; see `python -m lab status`")
        fleet.set_gpu_profile(host, args.profile)


if __name__ == "__main__":
    main()
