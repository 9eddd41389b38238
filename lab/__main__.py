"""python -m lab up [--hosts SPEC] [--bare HOST,...] [--os bookworm|trixie] | status | down | gpu HOST PROFILE"""

import argparse
import json

import lab
from lab import fleet, rootfs
from lab.config import HUB_URL, INDEX_URL


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
        for host in status["hosts"]:
            print(f"{host['name']:12} {host['address']:14} {host['host_class']:18} {host['gpu_profile']:28} "
                  f"{host['suite']:9} {host['state']}")
        print(json.dumps(status["services"]))
    elif args.command == "down":
        lab.down()
    elif args.command == "gpu":
        host = next((h for h in fleet.read_fleet() if h.name == args.host), None)
        if host is None:
            raise SystemExit(f"lab: no host {args.host}; see `python -m lab status`")
        fleet.set_gpu_profile(host, args.profile)


if __name__ == "__main__":
    main()
