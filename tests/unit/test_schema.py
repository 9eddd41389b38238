"""One schema of every knob (deployment/schema.py), each declared once: an unknown key is refused in one line at
every layer, naming it, where it was set and the nearest knob, before anything changes; its declaration parses
the value its subject reads; docs/configuration.md is its page."""

import subprocess
import sys

import pytest

from deployment import schema
from tests.helpers import PYINFRA, REPO


def test_an_unknown_key_is_one_line_naming_it_where_and_the_nearest_knob():
    assert schema.problem("proflie", schema.DATA, "--data") == (
        "--data sets `proflie`, which is no knob of specfleet: did you mean `profile`? "
        "(docs/configuration.md lists every knob)")
    assert "did you mean `verify_weights`?" in schema.problem("verify_weight", schema.HOST, "host a")
    assert "did you mean `modes`?" in schema.problem("mode", schema.DATA, "--data")
    assert schema.problem("zzzz", schema.DATA, "--data").endswith("no knob of specfleet "
                                                                  "(docs/configuration.md lists every knob)")


def test_pyinfras_own_keys_and_a_files_private_names_pass():
    for key in ("ssh_hostname", "ssh_user", "ssh_key", "ssh_strict_host_key_checking", "_sudo", "_sudo_user",
                "_helper"):
        assert schema.problem(key, schema.HOST, "host a") is None, key


def test_a_knob_set_where_its_layers_do_not_allow_is_refused():
    assert schema.problem("pins", schema.DATA, "--data") == (
        "--data sets `pins`, which --data may not set: set it in group data")
    assert schema.problem("node_rank", schema.HOST, "host a") is None


def test_every_shipped_group_files_key_is_a_knob():
    import runpy

    from pyinfra.api import Inventory
    from pyinfra.context import ctx_inventory

    files = [*sorted((REPO / "group_data").glob("*.py")), REPO / "lab" / "group_data" / "lab.py"]
    with ctx_inventory.use(Inventory(([], {}))):
        for path in files:
            values = {k: v for k, v in runpy.run_path(str(path)).items() if not k.startswith("__")}
            assert schema.refused(values, schema.GROUP, str(path)) == [], path


def test_each_knob_is_one_entry_in_a_section_of_the_page():
    assert len(schema.BY_NAME) == len(schema.KNOBS), "a knob named twice"
    assert {knob.subject for knob in schema.KNOBS} <= set(schema.SECTIONS), "a knob in no section of the page"
    assert all(set(knob.layers) <= set(schema.LAYERS) and knob.help and "\n" not in knob.help
               for knob in schema.KNOBS)


def test_the_reference_page_is_generated_from_the_schema():
    """Run `python -m tools.configuration_page` after changing a knob."""
    from tools import configuration_page

    assert configuration_page.PAGE.read_text() == configuration_page.page(), \
        "docs/configuration.md is stale: python -m tools.configuration_page"
    assert all(f"| `{knob.name}` |" in configuration_page.PAGE.read_text() for knob in schema.KNOBS)


def _group_files() -> dict[str, dict]:
    import runpy

    from pyinfra.api import Inventory
    from pyinfra.context import ctx_inventory

    with ctx_inventory.use(Inventory(([], {}))):
        return {path.stem: {k: v for k, v in runpy.run_path(str(path)).items() if not k.startswith("_")}
                for path in sorted((REPO / "group_data").glob("*.py"))}


def test_a_default_lives_in_one_place_the_group_file_the_declaration_names_or_the_declaration():
    files = _group_files()
    for name, values in files.items():
        for key in values:
            if key in schema.BY_NAME:  # the files' own imports and helpers aside
                assert schema.BY_NAME[key].group in (name, schema._CLASS), f"group_data/{name}.py sets `{key}`"
    for knob in schema.KNOBS:
        if knob.group in files:
            assert knob.default is None and knob.name in files[knob.group], knob.name
    assert {knob.name for knob in schema.KNOBS if knob.default is not None} == {
        "concurrency", "output_tokens", "results_dir", "max_throughput_drop", "max_accept_drop", "each_replica",
        "objective", "search"}


def test_a_subject_reads_the_value_its_declaration_parses():
    from tests.unit.group_data import host_data

    data = host_data("h100_sxm", port="30010", remove_api_key="yes")
    assert schema.value(data, "port") == 30010 and schema.value(data, "remove_api_key") is True
    assert schema.value(data, "ready_timeout_s") is None and schema.value(data, "install_dir") == "/opt/specfleet"
    assert schema.value({}, "concurrency") == (1, 4, 16, 64) and schema.value({}, "each_replica") is True
    assert schema.value({"concurrency": "16, 1,16"}, "concurrency") == (1, 16)
    with pytest.raises(schema.knobs.BadHostData, match=r"^nccl_port='80' is not a whole number from 1024 to 65535$"):
        schema.value({"nccl_port": "80"}, "nccl_port")
    with pytest.raises(schema.knobs.BadHostData, match=r"^prometheus_retention='15m' is not accepted: use a duration"):
        schema.value({"prometheus_retention": "15m"}, "prometheus_retention")
    # A URL knob is https unless its companion knob trusts plain HTTP.
    with pytest.raises(schema.knobs.BadHostData, match=r"set allow_http_index=true to trust plain HTTP"):
        schema.value({"pip_index_url": "http://index.example/simple", "allow_http_index": False}, "pip_index_url")
    assert schema.value({"pip_index_url": "http://index.example/simple", "allow_http_index": "yes"},
                        "pip_index_url") == "http://index.example/simple"


def test_a_retired_knob_is_declared_once_and_refused_by_its_subject_in_its_words():
    from deployment import hosts
    from serving_benchmark.plan import plan
    from tests.unit.group_data import host_data

    retired = [knob for knob in schema.KNOBS if knob.subject == "retired"]
    assert {knob.name: knob.refused_by for knob in retired} == {"input_tokens": "bench", "force": "bench",
                                                                "gpu_smoke_engine": "gpu"}
    for knob in retired:
        refusal = f"{knob.name}='x' is not accepted: {knob.help}"
        with pytest.raises(schema.knobs.BadHostData) as raised:
            if knob.refused_by == "bench":
                plan({knob.name: "x"})
            else:
                hosts.resolve(host_data("b200_nvlink", **{knob.name: "x"}), "b200_nvlink")
        assert str(raised.value) == refusal
        assert f"| `{knob.name}` | retired | None | any | {knob.help} |" in (REPO / "docs" / "configuration.md").read_text()


def test_the_schema_reads_no_subject_and_the_page_tool_is_imported_by_nothing():
    """The knob table sits under every subject (they read their values through it); the page is written by a
    tool on the top floor, which may read anything and which no module of the product imports."""
    import ast

    def imported(path):
        tree = ast.parse(path.read_text())
        return {(node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
                for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names}

    assert {name for name in imported(REPO / "deployment" / "schema.py") if name.startswith(
        ("deployment", "operations", "serving_benchmark", "tuning", "tools"))} == {"deployment"}
    product = [*(REPO / "deployment").rglob("*.py"), *(REPO / "operations").rglob("*.py"),
               *(REPO / "serving_benchmark").rglob("*.py"), *(REPO / "tuning").rglob("*.py"), *REPO.glob("*.py")]
    assert [str(p) for p in product if any(name.split(".")[0] == "tools" for name in imported(p))] == []


def dry(tmp_path, inventory: str, *args: str, yes: bool = True, run: bool = False) -> subprocess.CompletedProcess:
    """`pyinfra [-y] INVENTORY deploy.py --dry ARGS` (the real run: `run`) on @local hosts, whose refusals are
    known as the deploy file is read: nothing is prepared for them but operations that change nothing."""
    path = tmp_path / "fleet.py"
    path.write_text(inventory)
    command = [str(PYINFRA), *(["-y"] if yes else []), str(path), "deploy.py", *([] if run else ["--dry"]), *args]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**__import__("os").environ, "SPECFLEET_SITE": ""})
    result.output = result.stdout + result.stderr
    return result


def test_a_misspelt_data_key_stops_the_deploy_in_one_line(tmp_path):
    result = dry(tmp_path, "rtx_pro_6000_pcie = [('@local', {})]\n", "--data", "proflie=qwen36_ddtree")
    assert result.returncode == 1 and "Traceback" not in result.output, result.output[-3000:]
    assert result.output.count("proflie") == 1, result.output[-3000:]
    assert ("--data sets `proflie`, which is no knob of specfleet: did you mean `profile`?" in result.output)
    assert "Starting operation" not in result.output


def test_a_misspelt_inventory_key_stops_the_deploy_naming_the_host(tmp_path):
    result = dry(tmp_path, "rtx_pro_6000_pcie = [('@local', {'verify_weight': True})]\n")
    assert result.returncode == 1, result.output[-3000:]
    assert ("inventory data of host @local sets `verify_weight`, which is no knob of specfleet: did you mean "
            "`verify_weights`?") in result.output, result.output[-3000:]


@pytest.mark.parametrize("yes", [True, False])
def test_a_host_in_no_class_group_is_refused_and_dry_exits_non_zero(tmp_path, yes):
    """Under -y pyinfra evaluates no operation before the run: the refusal is said as deploy.py is read."""
    result = dry(tmp_path, "rtx_pro_6000 = [('@local', {})]\n", yes=yes)
    assert result.returncode == 1 and "Traceback" not in result.output, result.output[-3000:]
    assert ("@local: the host is in no class group (its groups: @local, fleet, rtx_pro_6000): put it in exactly one of "
            "the inventory groups b200_nvlink, b300_nvlink, h100_sxm, h200_sxm, rtx_pro_6000_pcie, or in `gateway` alone") \
        in result.output, result.output[-3000:]
    assert result.output.count("[@local] @local: the host is in no class group") == 1, result.output[-3000:]


@pytest.mark.parametrize("yes", [True, False])
def test_a_bad_value_refuses_the_host_under_dry_with_and_without_yes(tmp_path, yes):
    result = dry(tmp_path, "rtx_pro_6000_pcie = [('@local', {})]\n", "--data", "ready_timeout_s=abc", yes=yes)
    assert result.returncode == 1 and "Traceback" not in result.output, result.output[-3000:]
    assert "@local: ready_timeout_s='abc'" in result.output, result.output[-3000:]


def test_site_file_with_a_misspelt_key_is_refused_naming_the_file(tmp_path, monkeypatch):
    (tmp_path / "site" / "group_data").mkdir(parents=True)
    (tmp_path / "site" / "group_data" / "all.py").write_text("hf_endpont = 'https://hub.example'\n")
    (tmp_path / "fleet.py").write_text("rtx_pro_6000_pcie = [('gpu-1', {})]\n")
    result = subprocess.run([sys.executable, "pin.py", str(tmp_path / "fleet.py")], cwd=REPO, capture_output=True,
                            text=True, timeout=120,
                            env={**__import__("os").environ, "SPECFLEET_SITE": str(tmp_path / "site")})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == (f"{tmp_path}/site/group_data/all.py sets `hf_endpont`, which is no knob of "
                                     "specfleet: did you mean `hf_endpoint`? (docs/configuration.md lists every "
                                     "knob)")


def test_with_every_host_refused_the_run_still_ends_with_its_summary(tmp_path):
    result = dry(tmp_path, "rtx_pro_6000_pcie = [('@local', {})]\n", "--data", "ready_timeout_s=abc", run=True)
    assert result.returncode == 1 and "No hosts remaining" not in result.output, result.output[-3000:]
    summary = result.output[result.output.index("--> Summary:"):]
    assert "@local  rtx_pro_6000_pcie" in summary and "failed: @local: ready_timeout_s='abc'" in summary, summary


def test_a_deploy_refuses_from_data_what_a_host_serves_pointing_to_the_site(tmp_path):
    """--data lasts one run: status.py, tests/deployed and the gateways would read the group data's profile after
    it. Refused per host, in one line each, with -y too (rollout.py's batches are deploys)."""
    key = "profile"
    for yes in (False, True):
        result = dry(tmp_path, "rtx_pro_6000_pcie = [('@local', {})]\n", "--data", f"{key}=qwen36_ddtree", yes=yes)
        assert result.returncode == 1 and "Traceback" not in result.output, result.output[-3000:]
        said = [line.strip() for line in result.output.splitlines()
                if line.strip().startswith("[@local] @local: --data sets")]  # the host's refusal line
        assert len(said) == 1 and said[0].startswith(f"[@local] @local: --data sets `{key}`, which says what a host "
                                                     "serves: a deploy's --data lasts one run"), result.output[-3000:]
        assert "set it in SPECFLEET_SITE/group_data/<group>.py" in said[0]


def test_dry_json_carries_each_refusal(tmp_path):
    """pyinfra's --json plan lists an unnamed operation's arguments: the refusal's reason."""
    import json

    result = dry(tmp_path, "rtx_pro_6000_pcie = [('@local', {})]\n", "--json", "--data", "ready_timeout_s=abc")
    assert result.returncode == 1, result.output[-3000:]
    plan = json.loads(result.stdout)["plan"]
    assert ["problem=@local: ready_timeout_s='abc' is not a whole number at least 1"] in [op["args"] for op in plan]


@pytest.mark.parametrize("command, said", [
    (["pin.py", "INVENTORY", "--data", "proflie=qwen36_ddtree"], "did you mean `profile`?"),
    (["rollout.py", "INVENTORY", "--data", "proflie=qwen36_ddtree"], "did you mean `profile`?"),
    (["rollout.py", "INVENTORY", "--data=verify_weight=true"], "did you mean `verify_weights`?"),
], ids=["pin", "rollout", "rollout --data="])
def test_pin_and_rollout_refuse_a_misspelt_data_key_before_anything(tmp_path, command, said):
    (tmp_path / "fleet.py").write_text("rtx_pro_6000_pcie = [('gpu-1', {})]\n")
    argv = [str(tmp_path / "fleet.py") if word == "INVENTORY" else word for word in command]
    result = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={**__import__("os").environ, "SPECFLEET_SITE": str(tmp_path)})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stdout + result.stderr
    assert result.stdout == "" and said in result.stderr and len(result.stderr.strip().splitlines()) == 1, \
        result.stdout + result.stderr


def test_bench_refuses_a_misspelt_knob_before_anything(tmp_path):
    (tmp_path / "fleet.py").write_text("rtx_pro_6000_pcie = [('@local', {})]\n")
    result = subprocess.run([str(PYINFRA), "-y", str(tmp_path / "fleet.py"), "bench.py", "--dry", "--data", "mode=ar"],
                            cwd=REPO, capture_output=True, text=True, timeout=300,
                            env={**__import__("os").environ, "SPECFLEET_SITE": ""})
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output, output[-3000:]
    assert "--data sets `mode`, which is no knob of specfleet: did you mean `modes`?" in output, output[-3000:]


def test_a_site_group_file_that_overrides_no_group_is_refused_naming_the_group_meant(tmp_path):
    (tmp_path / "site" / "group_data").mkdir(parents=True)
    (tmp_path / "site" / "group_data" / "rtx_pro_6000.py").write_text("layouts = {}\n")
    (tmp_path / "fleet.py").write_text("rtx_pro_6000_pcie = [('gpu-1', {})]\n")
    result = subprocess.run([sys.executable, "pin.py", str(tmp_path / "fleet.py")], cwd=REPO, capture_output=True,
                            text=True, timeout=120,
                            env={**__import__("os").environ, "SPECFLEET_SITE": str(tmp_path / "site")})
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().startswith(f"{tmp_path}/site/group_data/rtx_pro_6000.py overrides no group of "
                                            "specfleet (did you mean rtx_pro_6000_pcie.py?)"), result.stderr
