"""The weights' state and room derived on the controller from what the host program read on disk
(WeightsOnDisk, which needs no hub) equal what weights_state.py and weights_disk.py answer on the host, over a
repo directory holding what a host can hold: revisions complete, partial and linked, files linked out, the
fetcher's scratch, and the single directory of earlier versions."""

import hashlib
import json
import os

from operations.weights.checks import WeightsDisk, WeightsOnDisk
from operations.weights.download import WeightsState
from tests.helpers import host_programs_importable

host_programs_importable()
import weights_disk  # noqa: E402
import weights_manifest  # noqa: E402
import weights_on_disk  # noqa: E402
import weights_state  # noqa: E402

COMPLETE, PARTIAL, LINKED, A_FILE, ABSENT, LEGACY = "1" * 40, "2" * 40, "3" * 40, "4" * 40, "5" * 40, "6" * 40


def entry(path: str, data: bytes) -> dict:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "git_sha1": None}


def write(directory, files: dict[str, bytes]) -> list[dict]:
    for path, data in files.items():
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / path).write_bytes(data)
    return [entry(p, d) for p, d in files.items()]


def a_repo(tmp_path):
    """A repo directory and the hub's sizes for its files."""
    repo = tmp_path / "org--model"
    files = {"config.json": b"{}", "sub/model.safetensors": b"w" * 300, "tokenizer.json": b"t" * 40}
    listing = write(repo / COMPLETE, files)
    write(repo / COMPLETE, {".cache/huggingface/x.metadata": b"m", "sub/.cache/y": b"yy"})
    weights_manifest.write(repo / COMPLETE, "org/model", COMPLETE, listing)
    write(repo / PARTIAL, {"config.json": b"{}", "sub/model.safetensors": b"w" * 100})  # no manifest yet
    (repo / PARTIAL / "tokenizer.json").symlink_to(repo / COMPLETE / "tokenizer.json")  # a link: not its file
    (repo / LINKED).symlink_to(repo / COMPLETE)
    (repo / A_FILE).write_bytes(b"not a directory")
    (repo / "notes").mkdir()  # named by no commit
    # The single directory of earlier versions: its manifest's files, one of them through a linked directory.
    legacy = write(repo, {"legacy.safetensors": b"l" * 77})
    outside = tmp_path / "outside"
    write(outside, {"model.safetensors": b"o" * 5})
    (repo / "linked-sub").symlink_to(outside)
    weights_manifest.write(repo, "org/model", LEGACY,
                           [*legacy, entry("linked-sub/model.safetensors", b"o" * 5), entry("gone.json", b"g")])
    return repo, {e["path"]: e["size"] for e in listing}


def test_the_state_and_room_derived_from_the_repos_reading_are_the_host_programs_answers(tmp_path):
    repo, sizes = a_repo(tmp_path)
    dirs = [str(repo / name) for name in (COMPLETE, PARTIAL, LINKED, A_FILE, ABSENT)]
    read = WeightsOnDisk().process(weights_on_disk.answer({"repo_dirs": [str(repo)]}))
    disk = WeightsDisk.from_answer(read, local_dirs=tuple(dirs))
    state = WeightsState.from_answer(read, listings=json.dumps({d: sizes for d in dirs}))
    on_host_disk = {d: weights_disk.disk(d) for d in dirs}
    on_host_state = weights_state.main({d: sizes for d in dirs})
    for d in dirs:
        assert {**disk[d], "free": None} == {**on_host_disk[d], "free": None}, d
    assert state == on_host_state
    # What each reads, said plainly: the complete revision is complete; its scratch is no file of it.
    assert state[str(repo / COMPLETE)] == {"commit": COMPLETE, "bad": []}
    assert set(disk[str(repo / COMPLETE)]["files"]) == {"config.json", "sub/model.safetensors", "tokenizer.json",
                                                        weights_manifest.MANIFEST}
    assert state[str(repo / PARTIAL)] is None and state[str(repo / LINKED)] is None
    assert disk[str(repo / LINKED)] == {"linked": True}
    assert disk[str(repo / PARTIAL)]["files"]["tokenizer.json"] == len(str(repo / COMPLETE / "tokenizer.json"))
    # Another revision's content counts once it is a regular file of the size its manifest recorded, reached
    # through no link: the complete revision's three files and the earlier directory's one of its own.
    held = {f"sha256:{hashlib.sha256(data).hexdigest()}:{len(data)}"
            for data in (b"{}", b"w" * 300, b"t" * 40, b"l" * 77)}
    assert set(disk[str(repo / ABSENT)]["others"]) == held
    assert disk[str(repo / ABSENT)]["checked"] == str(repo) and disk[str(repo / ABSENT)]["files"] == {}
    legacy_held = f"sha256:{hashlib.sha256(b'l' * 77).hexdigest()}:77"
    assert disk[str(repo / COMPLETE)]["others"] == [legacy_held]  # the partial one has no manifest yet


def test_a_directory_the_reading_does_not_hold_is_left_to_the_facts_own_command(tmp_path):
    repo, sizes = a_repo(tmp_path)
    read = WeightsOnDisk().process(weights_on_disk.answer({"repo_dirs": [str(repo)]}))
    for elsewhere in (str(repo / "notes"), str(tmp_path / "other--repo" / COMPLETE)):
        assert WeightsDisk.from_answer(read, local_dirs=(str(repo / COMPLETE), elsewhere)) is None
        assert WeightsState.from_answer(read, listings=json.dumps({elsewhere: sizes})) is None


def test_the_reading_follows_no_link_and_names_only_revisions(tmp_path):
    repo, _ = a_repo(tmp_path)
    found = weights_on_disk.repo(str(repo))
    assert sorted(os.path.basename(d) for d in found["entries"]) == sorted([COMPLETE, PARTIAL, LINKED, A_FILE])
    assert found["entries"][str(repo / LINKED)] == {"linked": True}
    assert found["legacy"]["present"] == {"legacy.safetensors": 77}  # not the one through linked-sub, nor gone.json
