"""Each replica's KV plan kept on its host (operations/server/capacity_record.py), written only when it changes;
and the engine's own figure held against it within capacity.ENGINE_TOLERANCE."""

from pyinfra.api.command import FileUploadCommand
from pyinfra.facts.files import Directory, File

from deployment.server import capacity
from operations.basics.file_states import FileStates, digest_of
from operations.gpu.facts import NvidiaGpus
from operations.server import capacity_record
from operations.server.checks import kv_plan
from tests.unit import fakehost
from tests.unit.test_capacity import snapshots

GPUS = [{"index": i, "memory_total_mib": 183359} for i in range(8)]


def kimi_on_b200():
    from deployment.hosts import resolve_worker
    from tests.unit.group_data import host_data
    worker, (d, *_) = resolve_worker(host_data("b200_nvlink"), "b200_nvlink")
    return d.replicas[0], worker.gpu.expected


def kept(file_state, found=snapshots(595, 6)) -> tuple[list, list[str]]:
    replica, expected = kimi_on_b200()
    path = capacity_record.path(replica)
    facts = {NvidiaGpus: GPUS, FileStates: {path: file_state}, File: None, Directory: None}
    return fakehost.run(capacity_record.kept, facts, server=replica, expected=expected, snapshots=found)


def test_the_plan_is_written_beside_the_units_environment_file_root_s_and_readable():
    replica, expected = kimi_on_b200()
    assert capacity_record.path(replica) == "/etc/specfleet/sglang@kimi_k26_dflash-gpu0-7.kv-plan.json"
    commands, noops = kept(None)
    uploads = [c for c in commands if isinstance(c, FileUploadCommand)]
    assert len(uploads) == 1 and uploads[0].dest == capacity_record.path(replica) and noops == []
    written = uploads[0].src.getvalue()
    plan = kv_plan(replica, expected, snapshots(595, 6), GPUS)
    assert capacity_record.planned_tokens(written) == plan.tokens > 1_000_000  # what preflight planned
    assert any("chmod 644" in str(c) for c in commands) and any("chown root:root" in str(c) for c in commands)


def test_a_file_that_holds_the_plan_is_left_as_it_is():
    replica, expected = kimi_on_b200()
    content = capacity_record.text(kv_plan(replica, expected, snapshots(595, 6), GPUS)).encode()
    held = {"kind": "file", "mode": "644", "user": "root", "group": "root", "digest": digest_of(content)}
    commands, noops = kept(held)
    assert commands == [] and noops[0].endswith(f"holds the plan: {capacity_record.planned_tokens(content.decode()):,} tokens")
    assert kept({**held, "digest": digest_of(b"an older plan")})[0]  # another plan: written again


def test_a_model_the_planner_cannot_size_keeps_no_plan():
    unknown = snapshots(595)
    unknown["target"] = type(unknown["target"])("x/y", "a" * 40, unknown["target"].files,
                                                {"architectures": ["MysteryForCausalLM"]})
    commands, noops = kept(None, unknown)
    assert commands == [] and noops == ["sglang@kimi_k26_dflash-gpu0-7: no KV plan (preflight said why)"]
    # A plan from before (another model's) is removed: tests/deployed would hold this engine to it.
    commands, _ = kept({"kind": "file", "mode": "644", "user": "root", "group": "root", "digest": "x"}, unknown)
    assert commands == ["rm -f -- /etc/specfleet/sglang@kimi_k26_dflash-gpu0-7.kv-plan.json"]


def test_an_engine_within_the_tolerance_of_its_plan_passes_and_one_below_it_is_said_in_one_line():
    assert capacity.ENGINE_TOLERANCE == 0.10
    assert capacity.engine_shortfall("r", 1_000_000, 900_000) is None  # 10% fewer: the reserve's estimate
    assert capacity.engine_shortfall("r", 1_000_000, 1_300_000) is None  # more than planned holds the plan
    line = capacity.engine_shortfall("r", 1_000_000, 899_999)
    assert line.startswith("r: its engine holds 899,999 tokens (max_total_num_tokens in /server_info), 10% fewer "
                           "than the 1,000,000 planned, beyond the 10% tolerance: ")
