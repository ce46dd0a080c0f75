""".npz members: uncompressed ones memory-mapped with their CRC-32 still checked, compressed ones
streamed; numpy's own loader is the reference for the values and zipfile for the corruption."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from quantbench.data.npzread import MappedMember, MappedNpy, StreamedMember, open_npz
from quantbench.errors import QuantbenchError


def _rows(member, batch: int) -> np.ndarray:
    n = member.shape[0]
    return np.concatenate([member.read(s, min(s + batch, n)) for s in range(0, n, batch)])


def _corrupt_one_byte(path: Path, member: str) -> None:
    """Flips a byte in the middle of ``member``'s data (its header and the zip's stay intact)."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo(member)
    raw = bytearray(path.read_bytes())
    at = info.header_offset + info.compress_size // 2 + 200
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_stored_members_are_mapped_and_read_as_numpy_loads_them(tmp_path):
    x = np.random.default_rng(0).normal(size=(37, 3, 5, 7)).astype(np.float32)
    ids = np.arange(37 * 11, dtype=np.int64).reshape(37, 11)
    np.savez(tmp_path / "d.npz", x=x, ids=ids)
    members = open_npz(tmp_path / "d.npz")
    assert all(isinstance(m, MappedMember) for m in members.values())
    with np.load(tmp_path / "d.npz") as ref:
        for name in ("x", "ids"):
            got = _rows(members[name], batch=8)
            assert got.dtype == ref[name].dtype and np.array_equal(got, ref[name])
    assert members["x"].read(30, 37).shape == (7, 3, 5, 7)  # backwards: any order
    for m in members.values():
        m.close()


def test_compressed_members_stream(tmp_path):
    x = np.arange(60, dtype=np.float32).reshape(12, 5)
    np.savez_compressed(tmp_path / "d.npz", x=x)
    member = open_npz(tmp_path / "d.npz")["x"]
    assert isinstance(member, StreamedMember)
    assert np.array_equal(_rows(member, batch=5), x)
    member.close()


def test_a_corrupt_stored_member_fails_its_crc_like_zipfile(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((64, 32), np.float32))
    _corrupt_one_byte(path, "x.npy")
    with pytest.raises(zipfile.BadZipFile, match="CRC"), np.load(path) as ref:
        ref["x"]  # the reference: zipfile's own check finds the corruption
    member = open_npz(path)["x"]
    with pytest.raises(QuantbenchError, match=r"d\.npz\[x\.npy\].*CRC-32.*corrupt"):
        _rows(member, batch=16)
        member.close()


def test_an_intact_member_read_to_its_end_passes_its_crc(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, x=np.ones((64, 32), np.float32))
    member = open_npz(path)["x"]
    member.read(10, 20)  # skipping ahead still chains the skipped bytes
    member.read(20, 64)
    member.close()  # no error


def test_a_truncated_npz_says_so(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, x=np.ones((64, 32), np.float32))
    path.write_bytes(path.read_bytes()[:-4000])
    with pytest.raises(QuantbenchError, match=r"d\.npz"):
        open_npz(path)


def test_fortran_order_is_refused_only_when_read(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, x=np.ones((4, 3), np.float32), extra=np.asfortranarray(np.ones((4, 3))))
    members = open_npz(path)  # an unused Fortran array does not stop the others
    assert members["x"].read(0, 4).shape == (4, 3)
    with pytest.raises(QuantbenchError, match=r"extra\.npy.*Fortran"):
        members["extra"].read(0, 4)


def test_a_member_maps_its_file_only_while_it_is_read(tmp_path):
    """A folder of many thousand one-sample .npz files must not hold a map per file (the
    kernel's map count is bounded): a member maps at its first read and lets go at close."""
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    np.savez(tmp_path / "d.npz", x=x)
    member = open_npz(tmp_path / "d.npz")["x"]
    assert member._view is None  # opening reads the headers only
    rows = member.read(0, 10)
    member.close()
    assert member._view is None
    np.testing.assert_array_equal(rows, x)  # rows read keep their pages
    np.testing.assert_array_equal(member.read(2, 5), x[2:5])  # and it maps again


def _mapped_kib(path: Path) -> int:
    """Resident KiB of ``path``'s mappings in this process (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
            inside = len(head) >= 6 and head[5] == str(path)
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="needs /proc/self/smaps")
def test_rows_read_do_not_stay_resident(tmp_path):
    """A pass over a data set holds the rows it works on, not every page it has read: 8 MiB
    read row by row (and a skipped head, summed for the CRC from the map) leaves a few pages
    of the file resident, while each row read is its own writable copy."""
    path = tmp_path / "d.npz"
    x = np.random.default_rng(0).normal(size=(64, 32, 1024)).astype(np.float32)  # 128 KiB rows
    np.savez(path, x=x)
    member = open_npz(path)["x"]
    member.read(8, 9)  # skips rows 0-7: their CRC is summed from the map
    for i in range(9, 64):
        row = member.read(i, i + 1)
        assert row.flags.writeable and np.array_equal(row[0], x[i])
    member._crc.result()  # the CRC thread's last piece (and its callbacks) done
    assert _mapped_kib(path) <= 64, f"{_mapped_kib(path)} KiB of the 8 MiB file resident"
    member.close()  # the CRC passes: every byte, skipped or read, was summed


def test_a_npy_file_is_read_like_a_stored_member(tmp_path):
    """numpy's loader is the reference; its pages go as the npz's do."""
    x = np.random.default_rng(1).normal(size=(64, 32, 1024)).astype(np.float32)
    np.save(tmp_path / "d.npy", x)
    npy = MappedNpy(tmp_path / "d.npy")
    assert np.array_equal(_rows(npy, batch=5), np.load(tmp_path / "d.npy"))
    if Path("/proc/self/smaps").is_file():
        assert _mapped_kib(tmp_path / "d.npy") <= 64
    npy.close()
    (tmp_path / "t.npy").write_bytes((tmp_path / "d.npy").read_bytes()[:-4096])
    with pytest.raises(QuantbenchError, match=r"t\.npy: file is truncated"):
        MappedNpy(tmp_path / "t.npy")
