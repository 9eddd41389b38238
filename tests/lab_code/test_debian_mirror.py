"""The lab's Debian mirror (lab/apt_repo.py): Debian's own .debs, byte for byte, in an archive signed by the
lab's key, the only Debian source of a bookworm lab host. Builds from the cache in /var/cache/specfleet
(the first run on a machine downloads Debian's packages once, as `python -m lab up` does)."""

import hashlib
import subprocess

from lab import apt_repo
from lab.config import DEBIAN_URL


def debian_index(suite: str) -> dict[str, str]:
    """.deb name as apt stores it (PACKAGE_VERSION_ARCH.deb, the epoch's colon as %3a) -> SHA256, from
    Debian's own Packages index, as the controller's apt fetched and verified it."""
    lists = apt_repo.DEBIAN_CACHE / suite / "lists"
    [packages] = [p for p in lists.iterdir() if p.name.startswith("deb.debian.org_debian_dists_")
                  and "_Packages" in p.name]
    text = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", str(packages)], check=True,
                          capture_output=True, text=True).stdout
    index = {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace())
        if "Filename" in fields:
            name = f"{fields['Package']}_{fields['Version'].replace(':', '%3a')}_{fields['Architecture']}.deb"
            index[name] = fields["SHA256"]
    return index


def test_the_mirror_serves_debians_own_debs_in_an_archive_signed_by_the_lab(tmp_path):
    home, _ = apt_repo._signing_key(tmp_path)
    apt_repo._debian_archive(tmp_path, home, "bookworm")
    root = tmp_path / "debian"
    subprocess.run(["gpgv", "--keyring", str(home / "public.gpg"), str(root / "dists/bookworm/InRelease")],
                   check=True, capture_output=True)
    # Debian's own InRelease, which apt checked, still verifies with Debian's archive keyring.
    [inrelease] = (apt_repo.DEBIAN_CACHE / "bookworm" / "lists").glob("*_InRelease")
    subprocess.run(["gpgv", "--keyring", "/usr/share/keyrings/debian-archive-keyring.gpg", str(inrelease)],
                   check=True, capture_output=True)
    index = debian_index("bookworm")
    debs = sorted((root / "pool/main").glob("*.deb"))
    assert any(deb.name.startswith("prometheus_2.42.") for deb in debs)
    assert {deb.name: hashlib.sha256(deb.read_bytes()).hexdigest() for deb in debs} == \
        {deb.name: index[deb.name] for deb in debs}
    packages = (root / "dists/bookworm/main/binary-amd64/Packages").read_text()
    assert packages.count("Package: ") == len(debs) and "Filename: pool/main/prometheus_2.42." in packages


def test_a_bookworm_lab_host_gets_the_mirror_as_its_only_debian_source(tmp_path):
    home, public_key = apt_repo._signing_key(tmp_path / "apt")
    for release in ("bookworm", "trixie"):
        root = tmp_path / release
        (root / "etc/apt").mkdir(parents=True)
        (root / "usr/share/keyrings").mkdir(parents=True)
        (root / "etc/os-release").write_text(f'PRETTY_NAME="Debian"\nVERSION_CODENAME={release}\n')
        apt_repo.debian_source(root, tmp_path / "apt")
    assert (tmp_path / "bookworm/etc/apt/sources.list").read_text() == \
        f"deb [signed-by=/{apt_repo.DEBIAN_KEYRING}] {DEBIAN_URL} bookworm main\n"
    assert (tmp_path / "bookworm" / apt_repo.DEBIAN_KEYRING).read_bytes() == public_key
    assert (tmp_path / "trixie/etc/apt/sources.list").read_text() == "# the lab serves no Debian mirror for trixie\n"
