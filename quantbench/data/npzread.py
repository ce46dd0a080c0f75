"""``.npz`` members read row range by row range, without loading an array whole.

``np.savez`` stores its members uncompressed: such a member is memory-mapped and its rows are
copied out of the file's pages (no zip layer), which are then let go (``MADV_DONTNEED``): a
pass holds the parts it is working on, not every page of the file it has read. (Rows handed
out as views kept their pages resident while the binning or the judging read them behind the
reader: on a 295 MB data set the peak RSS held 190 MB of it, growing with the data set.) The
copy is one memcpy of the input, small beside inference. The zip's CRC-32 is still checked, as
``zipfile`` would check it: on a thread of its own (zlib releases the GIL), once the member has
been read to its end, and a mismatch fails the read that follows, or the reader's close.
Compressed (``np.savez_compressed``) or encrypted members stream through ``zipfile``; their
reads must go forward (a backward one starts the member again).
"""

from __future__ import annotations

import mmap
import os
import struct
import zipfile
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from quantbench.errors import QuantbenchError

#: checks the CRC-32 of memory-mapped members beside the pass (one thread: CRCs chain)
_CRC_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quantbench-crc")

#: ``madvise`` advice that lets mapped pages go (None where the platform has none)
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., name length, extra length
_LOCAL_SIGNATURE = b"PK\x03\x04"


class NpzMember:
    """One array of a ``.npz``: ``shape``, ``dtype``, and ``read(start, stop)`` of its rows."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool  # refused when read (an unused member may be Fortran-ordered)

    def __init__(self, path: Path, member: str):
        self.path, self.member = path, member

    @property
    def where(self) -> str:
        return f"{self.path}[{self.member}]"

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def read(self, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        """Releases the file (a mapped member's views keep its pages until they go)."""


class MappedMember(NpzMember):
    """An uncompressed member: rows are copied out of the memory-mapped file. The file is mapped
    at the first read and let go at :meth:`close` (a folder of many thousand ``.npz`` files never
    holds more maps than the files being read)."""

    def __init__(self, path: Path, member: str, info: zipfile.ZipInfo):
        super().__init__(path, member)
        with open(path, "rb") as f:
            signature, name_len, extra_len = _LOCAL_HEADER.unpack(_read_at(f, info, 30, path))
            if signature != _LOCAL_SIGNATURE:
                raise QuantbenchError(f"{self.where}: not a readable .npz member (bad zip header)")
            self._begin = info.header_offset + 30 + name_len + extra_len
            if os.fstat(f.fileno()).st_size < self._begin + info.file_size:
                raise QuantbenchError(f"{self.where}: file is truncated")
            f.seek(self._begin)
            self.shape, self.fortran, self.dtype = read_npy_header(f, path, member)
            self._header = f.tell() - self._begin
        self._unmapped(info.file_size, info.CRC)

    def _unmapped(self, size: int, crc: int | None) -> None:
        """The member's ``size`` bytes from ``_begin``, not mapped yet, ``crc`` to check."""
        self._size = size
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None  # the member's bytes, while mapped
        self._released = 0  # where the last read ended: the map's pages before it are let go
        self._expected_crc = crc  # None: nothing to check (a plain .npy)
        self._crc: Future[int] | None = None
        self._crc_end = 0  # bytes of the member whose CRC is chained so far

    def _member(self) -> memoryview:
        if self._view is None:
            try:
                with open(self.path, "rb") as f:
                    mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise QuantbenchError(f"{self.where}: cannot map the file ({exc})") from None
            self._map = mapped
            self._view = memoryview(mapped)[self._begin : self._begin + self._size]
        return self._view

    def _let_go(self, begin: int, end: int) -> None:
        """The map's pages from the one holding member byte ``begin`` to the one before that
        holding ``end`` leave the process' resident set: harmless whatever they hold (a page
        touched again is read again from the page cache)."""
        first = (self._begin + begin) // mmap.PAGESIZE * mmap.PAGESIZE
        last = (self._begin + end) // mmap.PAGESIZE * mmap.PAGESIZE
        mapped = self._map
        if mapped is not None and last > first and _DONTNEED is not None:
            mapped.madvise(_DONTNEED, first, last - first)

    def read(self, start: int, stop: int) -> np.ndarray:
        _refuse_fortran(self.fortran, self.where)
        self._check_crc(wait=False)
        rb = self.row_bytes
        begin, end = self._header + start * rb, self._header + stop * rb
        view = self._member()[begin:end]
        if len(view) != end - begin:
            raise QuantbenchError(f"{self.where}: file is truncated")
        rows = np.frombuffer(view, dtype=np.uint8).copy()
        if self._expected_crc is not None:
            self._chain_crc(begin, rows)
        self._let_go(min(begin, self._released), end)  # forward: the page it shares too
        self._released = end
        return rows.view(self.dtype).reshape((stop - start, *self.shape[1:]))

    def close(self) -> None:
        self._check_crc(wait=True)
        self._view = self._map = None
        self._released = 0

    def _chain_crc(self, begin: int, rows: np.ndarray) -> None:
        """The CRC of the member's bytes up to the end of ``rows`` (read at ``begin``): every
        byte before it, read (from the copy) or skipped (from the map, whose pages are let go
        once summed)."""
        end = begin + rows.size
        if self._crc_end < begin:
            skipped = (self._crc_end, begin)
            self._chain(self._member()[skipped[0] : skipped[1]])
            # once summed, its pages go, and any a fault brought back beside them (a fault
            # may map a whole large folio) up to where the reads have let go
            self._crc.add_done_callback(
                lambda _: self._let_go(skipped[0], max(skipped[1], self._released))
            )
        if self._crc_end < end:
            self._chain(memoryview(rows)[self._crc_end - begin :])

    def _chain(self, piece: memoryview) -> None:
        before = self._crc
        self._crc = _CRC_THREAD.submit(
            lambda: zlib.crc32(piece, before.result() if before is not None else 0)
        )
        self._crc_end += len(piece)

    def _check_crc(self, wait: bool) -> None:
        """A member read to its end whose CRC-32 is not the zip's fails, as ``zipfile`` does."""
        crc = self._crc
        if crc is None or self._crc_end < self._size or not (wait or crc.done()):
            return
        self._crc = None  # checked once
        if crc.result() != self._expected_crc:
            raise QuantbenchError(
                f"{self.where}: the data fails its CRC-32 check (the file is corrupt); "
                "write it again"
            )


class MappedNpy(MappedMember):
    """A ``.npy`` file read like a stored member (it has no CRC to check)."""

    def __init__(self, path: Path):  # noqa: D107 - no zip entry: the array starts the file
        NpzMember.__init__(self, path, "")
        try:
            with open(path, "rb") as f:
                self.shape, self.fortran, self.dtype = read_npy_header(f, path, "")
                self._begin, self._header, size = 0, f.tell(), os.fstat(f.fileno()).st_size
        except OSError as exc:
            raise QuantbenchError(f"{path}: not a readable .npy file ({exc})") from None
        if size < self._header + self.row_bytes * (self.shape[0] if self.shape else 1):
            raise QuantbenchError(f"{path}: file is truncated")
        self._unmapped(size, None)

    @property
    def where(self) -> str:
        return str(self.path)


class StreamedMember(NpzMember):
    """A compressed member, streamed through ``zipfile`` (reads must go forward)."""

    def __init__(self, path: Path, member: str):
        super().__init__(path, member)
        with zipfile.ZipFile(path) as z, z.open(member) as f:
            self.shape, self.fortran, self.dtype = read_npy_header(f, path, member)
        self._zip: zipfile.ZipFile | None = None
        self._stream: Any = None
        self._pos = 0

    def _open(self) -> None:
        self.close()
        self._zip = zipfile.ZipFile(self.path)
        self._stream = self._zip.open(self.member)
        read_npy_header(self._stream, self.path, self.member)
        self._pos = 0

    def read(self, start: int, stop: int) -> np.ndarray:
        _refuse_fortran(self.fortran, self.where)
        if self._stream is None or start < self._pos:
            self._open()
        try:
            if start > self._pos:
                self._stream.read((start - self._pos) * self.row_bytes)
            n = stop - start
            raw = self._stream.read(n * self.row_bytes)
        except (zipfile.BadZipFile, zlib.error) as exc:
            raise QuantbenchError(f"{self.where}: the data cannot be read ({exc})") from None
        if len(raw) != n * self.row_bytes:
            raise QuantbenchError(f"{self.where}: file is truncated")
        self._pos = stop
        return np.frombuffer(raw, dtype=self.dtype).reshape((n, *self.shape[1:]))

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        if self._zip is not None:
            self._zip.close()
        self._stream = self._zip = None


def open_npz(path: Path) -> dict[str, NpzMember]:
    """Every ``.npy`` member of ``path`` by array name, headers read and checked."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = [i for i in z.infolist() if i.filename.endswith(".npy")]
    except (zipfile.BadZipFile, OSError) as exc:
        raise QuantbenchError(f"{path}: not a readable .npz file ({exc})") from None
    return {i.filename[: -len(".npy")]: _member(path, i) for i in infos}


def _member(path: Path, info: zipfile.ZipInfo) -> NpzMember:
    mappable = info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1
    return (
        MappedMember(path, info.filename, info) if mappable else StreamedMember(path, info.filename)
    )


def read_npy_header(f: Any, path: Path, member: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, dtype) of the ``.npy`` that ``f`` is positioned at (``member``
    "" for a ``.npy`` file)."""
    where = f"{path}[{member}]" if member else str(path)
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    except Exception as exc:  # noqa: BLE001
        raise QuantbenchError(f"{where}: not a readable numpy array ({exc})") from None
    if dtype.hasobject:
        raise QuantbenchError(f"{where}: object arrays are not supported")
    return tuple(shape), bool(fortran), dtype


def _refuse_fortran(fortran: bool, where: str) -> None:
    if fortran:
        raise QuantbenchError(f"{where}: Fortran-ordered arrays are not supported")


def _read_at(f: Any, info: zipfile.ZipInfo, n: int, path: Path) -> bytes:
    f.seek(info.header_offset)
    raw = f.read(n)
    if len(raw) != n:
        raise QuantbenchError(f"{path}[{info.filename}]: file is truncated")
    return raw
