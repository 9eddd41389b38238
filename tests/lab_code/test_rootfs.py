"""The lab's root filesystems: one cache per Debian suite, and a new root removes only its own suite's old ones."""

from lab import rootfs


def test_each_suite_has_its_own_root_and_bookworm_keeps_its_cache_name():
    bookworm, trixie = rootfs._key("bookworm"), rootfs._key("trixie")
    assert bookworm != trixie
    assert rootfs.base_root("bookworm").parent.name == f"base-{bookworm}"  # as before suites: its cache stays valid
    assert rootfs.base_root("trixie").parent.name == f"base-trixie-{trixie}"


def test_a_new_root_removes_only_older_roots_of_its_own_suite(tmp_path, monkeypatch):
    monkeypatch.setattr(rootfs, "CACHE_DIR", tmp_path)
    for name in ("base-0123456789ab", "base-aaaaaaaaaaaa.staging", "base-trixie-0123456789ab",
                 "base-trixie-bbbbbbbbbbbb", "base.lock"):
        (tmp_path / name).mkdir()
    rootfs._remove_stale(tmp_path / "base-trixie-bbbbbbbbbbbb", "trixie")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "base-0123456789ab", "base-aaaaaaaaaaaa.staging", "base-trixie-bbbbbbbbbbbb", "base.lock"]
    (tmp_path / "base-cccccccccccc").mkdir()
    rootfs._remove_stale(tmp_path / "base-cccccccccccc", "bookworm")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "base-aaaaaaaaaaaa.staging", "base-cccccccccccc", "base-trixie-bbbbbbbbbbbb", "base.lock"]
