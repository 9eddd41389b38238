"""What the deploy renders for every shipped profile on every shipped class, byte for byte as recorded in
tests/fixtures/rendered/: each replica's unit, environment file, SGLang command line and flag-check settings,
and each deployment's paths, for one deployment per host, several on one host and a node group. A change
to the model's code that is meant to keep behaviour keeps these files; a change that means to alter them
rewrites them (`python -m tests.unit.test_rendered`) and the diff shows what moved.
"""

import sys
from pathlib import Path

import pytest

from deployment import site_data
from deployment.gateway.config import resolve as resolve_gateway
from deployment.hosts import resolve_worker
from deployment.knobs import BadHostData
from deployment.nodes.group import members
from deployment.server.command_line import server_args
from operations.server import sandbox, unit
from tests.unit.group_data import RTX_MINORS, host_data
from tests.unit.test_gateway import inventory_host

RENDERED = Path(__file__).resolve().parents[1] / "fixtures" / "rendered"
COMMITS = {"target": "a" * 40, "drafter": "b" * 40}
SEVERAL = [dict(profile="kimi_k26_dflash", gpus=[0, 1, 2, 3], tp_size=4),
           dict(profile="qwen36_ddtree", gpus=[4, 5, 6, 7], name="qwen")]


def _profiles() -> list[str]:
    return sorted(host_data("rtx_pro_6000_pcie").profiles)


def rendered_host(data, host_class: str, node_members=None) -> str:
    """Everything the deploy writes or runs for one host's servers, as one text."""
    try:
        worker, deployments = resolve_worker(data, host_class, node_members)
    except BadHostData as refusal:
        return f"refused: {refusal}\n"
    minors = RTX_MINORS if host_class == "rtx_pro_6000_pcie" else ()
    out = []
    for d in deployments:
        e = d.engine
        out.append(f"## deployment {d.name}: profile {e.profile_name}, user {e.user}, venv {e.venv}\n"
                   f"model {e.model_dir}\ndrafter {e.draft_model_dir}\n"
                   "".join(f"{w.role} {w.repo_id}@{w.revision} {w.local_dir} {w.unit_name}\n" for w in d.weights.repos))
        for r in d.replicas:
            unit_text, env_text = sandbox.unit_files(r, unit.inputs(e, COMMITS), minors)
            out.append(f"### {r.service_name} gpus {r.gpus} port {r.port} nccl {r.nccl_port}\n"
                       f"{r.unit_file}\n{unit_text}\n{r.env_file}\n{env_text}\n"
                       f"argv {server_args(r)}\ncheck {list(sandbox.check_settings(r, minors))}\n")
    return "".join(out)


def cases() -> dict[str, str]:
    found = {}
    for host_class in site_data.host_classes():
        for profile in _profiles():
            found[f"{host_class}-{profile}"] = rendered_host(host_data(host_class, profile=profile), host_class)
    found["rtx_pro_6000_pcie-several"] = rendered_host(host_data("rtx_pro_6000_pcie", deployments=SEVERAL),
                                                       "rtx_pro_6000_pcie")
    group = {"kimi-tp16": dict(tp_size=16, dist_init_port=25000, socket_ifname="ens1f0")}
    inventory = [inventory_host(f"b200-{rank}", ["b200_nvlink"], ssh_hostname=f"10.0.0.{rank + 1}",
                                node_group="kimi-tp16", node_rank=rank, node_groups=group) for rank in (0, 1)]
    for host in inventory:
        found[f"node_group-{host.name}"] = rendered_host(host.data, "b200_nvlink", members(inventory, host))
    found["gateway"] = f"argv {resolve_gateway(host_data('gateway')).args()}\n"
    return found


@pytest.mark.parametrize("name", sorted(cases()))
def test_the_rendered_files_are_as_recorded(name):
    assert cases()[name] == (RENDERED / f"{name}.txt").read_text()


def test_every_recorded_case_is_still_rendered():
    assert sorted(p.stem for p in RENDERED.glob("*.txt")) == sorted(cases())


if __name__ == "__main__":
    RENDERED.mkdir(parents=True, exist_ok=True)
    for stale in RENDERED.glob("*.txt"):
        stale.unlink()
    for name, text in cases().items():
        (RENDERED / f"{name}.txt").write_text(text)
    print(f"{len(cases())} cases written to {RENDERED}", file=sys.stderr)
