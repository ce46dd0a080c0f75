"""Calibration and evaluation data: every source becomes a stream of validated feed batches.

Sources (``open_data``): a ``.npz`` keyed by input name, a ``.npy`` (single-input models), a
folder of such files, a Python data-loader script (``file.py`` or ``file.py:function``; the
function yields ``{input_name: array}`` feeds, Polygraphy's convention), or a folder of images
with a preprocessing preset from ``configs/``. From Python, also any object with onnxruntime's
``CalibrationDataReader`` protocol (``get_next()``) or any iterable of feed dicts.

Arrays are read lazily — ``.npy`` memory-mapped, ``.npz`` members streamed row by row from the
zip — so memory does not grow with the number of samples. Everything is checked against the
model's inputs before any inference runs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import tomllib

from quantbench.errors import QuantbenchError
from quantbench.graph import TensorSpec

Feed = dict[str, np.ndarray]
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".webp", ".tif", ".tiff")
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class CalibrationDataReaderLike(Protocol):
    def get_next(self) -> Mapping[str, np.ndarray] | None: ...


# --------------------------------------------------------------------------- array readers


class ArrayReader(Protocol):
    """A sample-axis-first array read in slices, without loading it whole."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def read(self, start: int, stop: int) -> np.ndarray: ...


@dataclass
class _MemArray:
    array: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        return np.asarray(self.array[start:stop])


class _NpzMember:
    """One ``.npz`` member streamed sequentially from the zip (reads must go forward)."""

    def __init__(self, path: Path, member: str):
        self.path, self.member = path, member
        with zipfile.ZipFile(path) as z, z.open(member) as f:
            self.shape, self.fortran, self.dtype = _read_npy_header(f, path, member)
        self._zip: zipfile.ZipFile | None = None
        self._stream: Any = None
        self._pos = 0

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def _open(self) -> None:
        self.close()
        self._zip = zipfile.ZipFile(self.path)
        self._stream = self._zip.open(self.member)
        _read_npy_header(self._stream, self.path, self.member)
        self._pos = 0

    def read(self, start: int, stop: int) -> np.ndarray:
        if self.fortran:
            raise QuantbenchError(
                f"{self.path}[{self.member}]: Fortran-ordered arrays are not supported"
            )
        if self._stream is None or start < self._pos:
            self._open()
        if start > self._pos:
            self._stream.read((start - self._pos) * self.row_bytes)
        n = stop - start
        raw = self._stream.read(n * self.row_bytes)
        if len(raw) != n * self.row_bytes:
            raise QuantbenchError(f"{self.path}[{self.member}]: file is truncated")
        self._pos = stop
        return np.frombuffer(raw, dtype=self.dtype).reshape((n, *self.shape[1:]))

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        if self._zip is not None:
            self._zip.close()
        self._stream = self._zip = None


def _read_npy_header(f: Any, path: Path, member: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    except Exception as exc:  # noqa: BLE001
        raise QuantbenchError(f"{path}[{member}]: not a readable numpy array ({exc})") from None
    if dtype.hasobject:
        raise QuantbenchError(f"{path}[{member}]: object arrays are not supported")
    return tuple(shape), bool(fortran), dtype


def _open_npz(path: Path) -> dict[str, ArrayReader]:
    try:
        with zipfile.ZipFile(path) as z:
            members = [m for m in z.namelist() if m.endswith(".npy")]
    except (zipfile.BadZipFile, OSError) as exc:
        raise QuantbenchError(f"{path}: not a readable .npz file ({exc})") from None
    return {m[: -len(".npy")]: _NpzMember(path, m) for m in members}


def _open_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # noqa: BLE001
        raise QuantbenchError(f"{path}: not a readable .npy file ({exc})") from None


# --------------------------------------------------------------------------- data sources


@dataclass
class DataSource:
    """A validated stream of feeds for one model.

    ``batches()`` can be iterated several times (file sources re-read from disk). ``fingerprint``
    identifies the data without running inference (``None`` for opaque readers, whose
    fingerprint is computed from the stream as it goes: see :class:`StreamFingerprint`).
    """

    description: str
    fingerprint: str | None
    num_samples: int | None
    _make_batches: Callable[[], Iterator[Feed]] = field(repr=False)

    def batches(self) -> Iterator[Feed]:
        return self._make_batches()


def _file_digest(paths: Iterable[Path], extra: str) -> str:
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(p.name.encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def open_data(
    source: str | Path | CalibrationDataReaderLike | Iterable[Mapping[str, np.ndarray]],
    inputs: list[TensorSpec],
    *,
    batch_size: int | None = None,
    max_samples: int | None = None,
    preset: str | Path | None = None,
) -> DataSource:
    """Open any supported data source for a model with the given inputs (validated)."""
    if max_samples is not None and max_samples <= 0:
        raise QuantbenchError("--max-samples must be positive")
    if batch_size is not None and batch_size <= 0:
        raise QuantbenchError("--batch-size must be positive")
    if not isinstance(source, (str, Path)):
        return _from_python(source, inputs, max_samples)
    spec = str(source)
    path_part, _, func = spec.partition(".py:")
    if func or spec.endswith(".py"):
        script = Path(path_part + ".py") if func else Path(spec)
        return _from_script(script, func or "load_data", inputs, max_samples)
    path = Path(spec)
    if not path.exists():
        raise QuantbenchError(f"{path}: data file or folder not found")
    if path.is_dir():
        images = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        arrays = sorted(p for p in path.iterdir() if p.suffix in (".npy", ".npz"))
        if images and not arrays:
            return _from_images(path, images, inputs, batch_size, max_samples, preset)
        if not arrays:
            raise QuantbenchError(f"{path}: folder holds no .npy, .npz or image files")
        return _from_array_files(path, arrays, inputs, batch_size, max_samples)
    if path.suffix in (".npz", ".npy"):
        return _from_array_files(path, [path], inputs, batch_size, max_samples)
    if path.suffix.lower() in IMAGE_SUFFIXES:
        return _from_images(path, [path], inputs, batch_size, max_samples, preset)
    raise QuantbenchError(
        f"{path}: unsupported data file; use .npz/.npy, a folder of them, a folder of images "
        "(with --preset), or a Python data-loader script (file.py[:function])"
    )


# ---- arrays -----------------------------------------------------------------------------


def _readers_for_file(path: Path, inputs: list[TensorSpec]) -> dict[str, ArrayReader]:
    if path.suffix == ".npy":
        if len(inputs) != 1:
            raise QuantbenchError(
                f"{path}: a .npy holds one array but the model has {len(inputs)} inputs "
                f"({', '.join(s.name for s in inputs)}); use a .npz keyed by input name"
            )
        return {inputs[0].name: _MemArray(_open_npy(path))}
    readers = _open_npz(path)
    if len(inputs) == 1 and len(readers) == 1 and inputs[0].name not in readers:
        # a single unnamed array (np.savez(f, x) stores it as arr_0) feeds the single input
        only = next(iter(readers))
        if only.startswith("arr_"):
            readers = {inputs[0].name: readers[only]}
    return readers


def _from_array_files(
    origin: Path,
    files: list[Path],
    inputs: list[TensorSpec],
    batch_size: int | None,
    max_samples: int | None,
) -> DataSource:
    per_file = [_readers_for_file(f, inputs) for f in files]
    counts = []
    for f, readers in zip(files, per_file):
        _check_names(f, set(readers), inputs)
        counts.append(_check_arrays(f, readers, inputs))
    total = sum(counts)
    if total == 0:
        raise QuantbenchError(f"{origin}: the data set is empty (0 samples)")
    n = min(total, max_samples) if max_samples else total
    bs = resolve_batch_size(inputs, batch_size, origin)
    fingerprint = _file_digest(files, f"arrays;max={n}")

    def batches() -> Iterator[Feed]:
        remaining = n
        for readers, count in zip(per_file, counts):
            pos = 0
            while remaining > 0 and pos < count:
                take = min(bs, count - pos, remaining)
                yield _batch_feed(readers, inputs, pos, pos + take)
                pos += take
                remaining -= take
            for r in readers.values():
                if isinstance(r, _NpzMember):
                    r.close()

    return DataSource(f"{origin} ({n} samples)", fingerprint, n, batches)


def _batch_feed(
    readers: Mapping[str, ArrayReader], inputs: list[TensorSpec], a: int, b: int
) -> Feed:
    feed: Feed = {}
    for spec in inputs:
        arr = readers[spec.name].read(a, b)
        if len(readers[spec.name].shape) != len(spec.shape):
            arr = arr[0]  # the model has no batch axis: one sample per feed
        feed[spec.name] = _cast(arr, spec)
    return feed


def resolve_batch_size(inputs: list[TensorSpec], requested: int | None, origin: object) -> int:
    """The model's static batch size if it has one (and then ``requested`` must match)."""
    static = {s.shape[0] for s in inputs if s.shape and isinstance(s.shape[0], int)}
    if len(static) == 1:
        fixed = static.pop()
        if requested is not None and requested != fixed:
            raise QuantbenchError(
                f"{origin}: the model has a fixed batch size of {fixed}; --batch-size {requested} "
                "cannot be used (re-export the model with a dynamic batch dimension)"
            )
        return fixed
    return requested or 1


def _check_names(origin: Path | str, names: set[str], inputs: list[TensorSpec]) -> None:
    want = {s.name for s in inputs}
    missing, extra = sorted(want - names), sorted(names - want)
    if missing:
        hint = f"; it has {', '.join(sorted(names)) or 'nothing'}" if names else ""
        raise QuantbenchError(
            f"{origin}: no data for model input(s) {', '.join(missing)}{hint}"
            + (f" (unexpected: {', '.join(extra)})" if extra else "")
        )


def _check_arrays(
    origin: Path, readers: Mapping[str, ArrayReader], inputs: list[TensorSpec]
) -> int:
    counts = set()
    for spec in inputs:
        r = readers[spec.name]
        _check_dtype(f"{origin}[{spec.name}]", r.dtype, spec)
        rank = len(spec.shape)
        if len(r.shape) == rank:
            dims_to_check = list(zip(r.shape[1:], spec.shape[1:]))
        elif len(r.shape) == rank + 1:
            dims_to_check = list(zip(r.shape[1:], spec.shape))
        else:
            raise QuantbenchError(
                f"{origin}[{spec.name}]: array shape {list(r.shape)} does not fit model input "
                f"{spec.describe()}: expected rank {rank} (sample axis = batch axis) or {rank + 1}"
            )
        for have, want in dims_to_check:
            if isinstance(want, int) and have != want:
                raise QuantbenchError(
                    f"{origin}[{spec.name}]: array shape {list(r.shape)} does not match model "
                    f"input {spec.describe()} (sample axis first)"
                )
        counts.add(r.shape[0])
    if len(counts) > 1:
        raise QuantbenchError(f"{origin}: inputs have different sample counts {sorted(counts)}")
    return counts.pop() if counts else 0


def _check_dtype(where: str, dtype: np.dtype, spec: TensorSpec) -> None:
    want = np.dtype(spec.dtype)
    if np.issubdtype(want, np.floating) and np.issubdtype(dtype, np.floating):
        return  # float64 -> float32 is cast: numpy's default dtype is not a user mistake
    if np.issubdtype(want, np.integer) and np.issubdtype(dtype, np.integer):
        return
    if dtype == want:
        return
    raise QuantbenchError(
        f"{where}: dtype {dtype.name} does not match model input {spec.describe()}"
    )


def _cast(arr: np.ndarray, spec: TensorSpec) -> np.ndarray:
    return np.ascontiguousarray(arr, dtype=spec.dtype)


# ---- feeds from Python (readers, iterables, scripts) --------------------------------------


def validate_feed(feed: Mapping[str, Any], inputs: list[TensorSpec], where: str) -> Feed:
    """Check one feed dict against the model inputs; returns contiguous, cast arrays."""
    if not isinstance(feed, Mapping):
        raise QuantbenchError(
            f"{where}: expected a dict of input name -> array, got {type(feed).__name__}"
        )
    _check_names(where, set(feed), inputs)
    out: Feed = {}
    for spec in inputs:
        arr = np.asarray(feed[spec.name])
        _check_dtype(f"{where}[{spec.name}]", arr.dtype, spec)
        if arr.ndim != len(spec.shape) or any(
            isinstance(w, int) and h != w for h, w in zip(arr.shape, spec.shape)
        ):
            raise QuantbenchError(
                f"{where}[{spec.name}]: shape {list(arr.shape)} does not match model input "
                f"{spec.describe()}"
            )
        out[spec.name] = _cast(arr, spec)
    return out


def _feeds_of(obj: Any) -> Iterator[Mapping[str, np.ndarray]]:
    if hasattr(obj, "get_next"):
        while (item := obj.get_next()) is not None:
            yield item
    else:
        yield from obj


def _from_python(obj: Any, inputs: list[TensorSpec], max_samples: int | None) -> DataSource:
    if not (hasattr(obj, "get_next") or isinstance(obj, Iterable)):
        raise QuantbenchError(
            f"data of type {type(obj).__name__} is neither a path, a CalibrationDataReader "
            "(get_next()) nor an iterable of feed dicts"
        )
    consumed = False

    def batches() -> Iterator[Feed]:
        nonlocal consumed
        if consumed and hasattr(obj, "get_next") and hasattr(obj, "rewind"):
            obj.rewind()
        consumed = True
        yield from _limited(_feeds_of(obj), inputs, type(obj).__name__, max_samples)

    return DataSource(f"{type(obj).__name__} (Python)", None, None, batches)


def _from_script(
    path: Path, func: str, inputs: list[TensorSpec], max_samples: int | None
) -> DataSource:
    if not path.is_file():
        raise QuantbenchError(f"{path}: data-loader script not found")
    spec = importlib.util.spec_from_file_location(f"quantbench_data_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise QuantbenchError(f"{path}: cannot import data-loader script")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's script failed
        raise QuantbenchError(f"{path}: data-loader script failed on import: {exc!r}") from None
    loader = getattr(module, func, None)
    if loader is None:
        raise QuantbenchError(f"{path}: defines no function {func!r} (use {path}:NAME)")
    where = f"{path}:{func}"

    def batches() -> Iterator[Feed]:
        produced = loader() if callable(loader) else loader
        try:
            yield from _limited(_feeds_of(produced), inputs, where, max_samples)
        except QuantbenchError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise QuantbenchError(f"{where}: data loader raised {exc!r}") from None

    fingerprint = _file_digest([path], f"script;{func};max={max_samples}")
    return DataSource(where, fingerprint, None, batches)


def _limited(
    feeds: Iterator[Mapping[str, np.ndarray]],
    inputs: list[TensorSpec],
    where: str,
    max_samples: int | None,
) -> Iterator[Feed]:
    seen = 0
    for i, feed in enumerate(feeds):
        checked = validate_feed(feed, inputs, f"{where} batch {i}")
        n = _feed_samples(checked, inputs)
        if max_samples is not None and seen + n > max_samples:
            keep = max_samples - seen
            if keep <= 0:
                return
            if _batched(inputs):
                checked = {k: v[:keep] for k, v in checked.items()}
                n = keep
        yield checked
        seen += n
        if max_samples is not None and seen >= max_samples:
            return


def _batched(inputs: list[TensorSpec]) -> bool:
    return all(s.shape and not (isinstance(s.shape[0], int) and s.shape[0] == 1) for s in inputs)


def _feed_samples(feed: Feed, inputs: list[TensorSpec]) -> int:
    first = feed[inputs[0].name]
    return int(first.shape[0]) if first.ndim and len(inputs[0].shape) else 1


# ---- images ------------------------------------------------------------------------------


@dataclass
class Preset:
    """Image preprocessing from a ``configs/*.toml`` ``[input]`` table."""

    name: str | None = None
    layout: str = "NCHW"
    colour: str = "RGB"
    resize: tuple[int, int] | None = None
    resize_shorter: int | None = None
    center_crop: tuple[int, int] | None = None
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    dtype: str = "float32"
    source: str = ""

    @classmethod
    def load(cls, preset: str | Path) -> Preset:
        path = Path(preset)
        if not path.suffix:
            path = CONFIG_DIR / f"{preset}.toml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))) or "none"
            raise QuantbenchError(f"preset {preset}: not found (file or one of: {known})")
        try:
            table = tomllib.loads(path.read_text()).get("input", {})
        except tomllib.TOMLDecodeError as exc:
            raise QuantbenchError(f"{path}: invalid TOML ({exc})") from None

        def pair(v: Any) -> tuple[int, int] | None:
            if v is None:
                return None
            return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))

        p = cls(
            name=table.get("name"),
            layout=str(table.get("layout", "NCHW")).upper(),
            colour=str(table.get("colour", table.get("color", "RGB"))).upper(),
            resize=pair(table.get("resize")),
            resize_shorter=table.get("resize_shorter"),
            center_crop=pair(table.get("center_crop")),
            scale=float(table.get("scale", 1.0 / 255.0)),
            mean=tuple(float(x) for x in table.get("mean", (0.0, 0.0, 0.0))),
            std=tuple(float(x) for x in table.get("std", (1.0, 1.0, 1.0))),
            dtype=str(table.get("dtype", "float32")),
            source=str(path),
        )
        if p.layout not in ("NCHW", "NHWC") or p.colour not in ("RGB", "BGR"):
            raise QuantbenchError(f"{path}: layout must be NCHW/NHWC and colour RGB/BGR")
        return p

    def apply(self, path: Path) -> np.ndarray:
        """One image file -> one sample ([C,H,W] or [H,W,C])."""
        from PIL import Image

        try:
            img = Image.open(path).convert("RGB")
        except Exception as exc:  # noqa: BLE001
            raise QuantbenchError(f"{path}: not a readable image ({exc})") from None
        if self.resize_shorter:
            w, h = img.size
            s = self.resize_shorter / min(w, h)
            img = img.resize((round(w * s), round(h * s)), Image.Resampling.BILINEAR)
        if self.resize:
            img = img.resize((self.resize[1], self.resize[0]), Image.Resampling.BILINEAR)
        if self.center_crop:
            ch, cw = self.center_crop
            w, h = img.size
            left, top = (w - cw) // 2, (h - ch) // 2
            img = img.crop((left, top, left + cw, top + ch))
        x = np.asarray(img, dtype=np.float32) * np.float32(self.scale)
        if self.colour == "BGR":
            x = x[..., ::-1]
        x = (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        if self.layout == "NCHW":
            x = x.transpose(2, 0, 1)
        return np.ascontiguousarray(x, dtype=self.dtype)


def _from_images(
    origin: Path,
    files: list[Path],
    inputs: list[TensorSpec],
    batch_size: int | None,
    max_samples: int | None,
    preset: str | Path | None,
) -> DataSource:
    if preset is None:
        raise QuantbenchError(
            f"{origin}: image data needs a preprocessing preset: --preset NAME (from configs/) "
            "or --preset path/to/preset.toml"
        )
    p = Preset.load(preset)
    name = p.name or (inputs[0].name if len(inputs) == 1 else None)
    if name is None or name not in {s.name for s in inputs}:
        raise QuantbenchError(
            f"{p.source}: preset input name {name!r} is not a model input "
            f"({', '.join(s.name for s in inputs)}); set [input] name"
        )
    spec = next(s for s in inputs if s.name == name)
    if len(inputs) != 1:
        raise QuantbenchError(f"{origin}: image folders feed single-input models only")
    files = files[:max_samples] if max_samples else files
    sample = p.apply(files[0])
    expected = spec.shape[1:] if len(spec.shape) == sample.ndim + 1 else spec.shape
    if any(isinstance(w, int) and h != w for h, w in zip(sample.shape, expected)):
        raise QuantbenchError(
            f"{origin}: preset {Path(p.source).stem} makes images of shape {list(sample.shape)}, "
            f"model input is {spec.describe()}"
        )
    bs = resolve_batch_size(inputs, batch_size, origin)
    fingerprint = _file_digest(files, f"images;{Path(p.source).read_text()}")

    def batches() -> Iterator[Feed]:
        for i in range(0, len(files), bs):
            arr = np.stack([p.apply(f) for f in files[i : i + bs]])
            if len(spec.shape) == sample.ndim:
                arr = arr[0]
            yield {name: arr}

    return DataSource(
        f"{origin} ({len(files)} images, preset {Path(p.source).stem})",
        fingerprint,
        len(files),
        batches,
    )


class StreamFingerprint:
    """sha256 of the feeds as they stream by (for sources without an up-front fingerprint)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256(b"stream")

    def update(self, feed: Feed) -> None:
        for name in sorted(feed):
            a = feed[name]
            self._h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
            self._h.update(np.ascontiguousarray(a).tobytes())

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def feed_num_samples(feed: Feed, inputs: list[TensorSpec]) -> int:
    return _feed_samples(feed, inputs)
