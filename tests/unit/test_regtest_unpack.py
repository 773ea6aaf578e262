"""Unpacking the Bitcoin Core source: on an interpreter without tarfile's extraction filters (a
distribution's 3.11.2), the hand-made checks must refuse what the "data" filter refuses."""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from regtest.install import InstallError, _extract_checked, _extract_source


def _archive(tmp_path: Path, *members: tuple[str, bytes | None, bytes]) -> Path:
    """(name, link target or None, content) -> a .tar.gz in tmp_path."""
    path = tmp_path / "src.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, link, content in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = link.decode()
                tar.addfile(info)
            else:
                info.size = len(content)
                info.mode = 0o4755  # set-uid: must not survive
                tar.addfile(info, io.BytesIO(content))
    return path


def _unpack(archive: Path, dest: Path, extract) -> None:
    with tarfile.open(archive) as tar:
        extract(tar, tar.getmembers(), dest)


@pytest.mark.parametrize("extract", [_extract_checked, _extract_source])
def test_plain_files_are_unpacked_without_set_id_bits(tmp_path: Path, extract) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    _unpack(_archive(tmp_path, ("top/src/a.cpp", None, b"int main() {}\n")), dest, extract)
    unpacked = dest / "top" / "src" / "a.cpp"
    assert unpacked.read_bytes() == b"int main() {}\n"
    assert unpacked.stat().st_mode & 0o7000 == 0


@pytest.mark.parametrize("name", ["../escape.txt", "top/../../escape.txt", "/tmp/absolute.txt"])
def test_paths_outside_the_destination_are_refused(tmp_path: Path, name: str) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(InstallError, match="outside"):
        _unpack(_archive(tmp_path, (name, None, b"x")), dest, _extract_checked)
    assert not (tmp_path / "escape.txt").exists()


def test_links_are_refused(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(InstallError, match="not a plain file"):
        _unpack(_archive(tmp_path, ("top/link", b"/etc/passwd", b"")), dest, _extract_checked)
    assert not (dest / "top" / "link").exists()
