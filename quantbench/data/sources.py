"""Calibration and evaluation data: every source becomes a stream of validated feed batches.

Sources (``open_data``): a ``.npz`` keyed by input name, a ``.npy`` (single-input models), a
folder of such files, a Python data-loader script (``file.py`` or ``file.py:function``; the
function yields ``{input_name: array}`` feeds, Polygraphy's convention), or a folder of images
with a preprocessing preset (packaged ``quantbench.configs`` or a ``.toml`` path). From Python,
also any object with onnxruntime's ``CalibrationDataReader`` protocol (``get_next()``) or any
iterable of feed dicts.

One rule maps data onto the model for every source (:func:`plan_layout`): data of the model's
rank has the model's batch axis first; one axis more means the model has no batch axis and
each sample is fed alone. Arrays are read lazily — ``.npy`` and uncompressed ``.npz`` members
memory-mapped, compressed ones streamed from the zip (:mod:`quantbench.data.npzread`) — so memory
does not grow with the number of samples.
Everything is checked against the model's inputs before any inference runs; samples holding
NaN/Inf are recorded by index and reported (:class:`NonFiniteSamples`).
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from quantbench.data.npzread import MappedNpy, NpzMember, open_npz
from quantbench.data.presets import Preset, preset_names, preset_text
from quantbench.data.userscript import load_user_object
from quantbench.errors import QuantbenchError
from quantbench.machine import usable_cores
from quantbench.model.graph import TensorSpec
from quantbench.progress import warn

Feed = dict[str, np.ndarray]
T = TypeVar("T")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".webp", ".tif", ".tiff")


class CalibrationDataReaderLike(Protocol):
    def get_next(self) -> Mapping[str, np.ndarray] | None: ...


class Batch(dict[str, np.ndarray]):
    """One feed (input name -> exactly the array the model is given) and the number of data
    samples it holds, which is not its first dim when the model has no batch axis."""

    def __init__(self, arrays: Mapping[str, np.ndarray], num_samples: int):
        super().__init__(arrays)
        self.num_samples = num_samples


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


def _open_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # noqa: BLE001
        raise QuantbenchError(f"{path}: not a readable .npy file ({exc})") from None


def _close(readers: Iterable[ArrayReader]) -> None:
    for r in readers:
        if isinstance(r, NpzMember):
            r.close()


# --------------------------------------------------------------------------- batch layout


@dataclass(frozen=True)
class Layout:
    """How sample-first data meets the model's inputs, decided from ranks, never from a dim.

    ``per_sample``: inputs whose data has one axis more than the model (the model has no batch
    axis: samples are fed one at a time). Otherwise the data's first axis is the model's batch
    axis, fed ``batch_size`` samples at a time; ``fixed`` is the model's static batch size,
    which every feed must fill exactly. ``moved``: (input, axis) of inputs whose batch axis is
    not their first (a recurrent state ``[layers, batch, hidden]``): their sample-first data is
    moved there in each feed.
    """

    per_sample: frozenset[str]
    fixed: int | None
    batch_size: int
    moved: tuple[tuple[str, int], ...] = ()

    def check_count(self, n: int, where: str) -> None:
        """Samples must fill whole batches of a fixed batch size: none is dropped silently."""
        if self.fixed and n % self.fixed:
            raise QuantbenchError(
                f"{where}: {n} samples do not fill whole batches of the model's fixed batch size "
                f"{self.fixed} ({n % self.fixed} left over); give a multiple of {self.fixed} "
                "samples or export the model with a dynamic batch axis"
            )

    def feeds(self, chunk: Mapping[str, np.ndarray], n: int) -> Iterator[Batch]:
        """``n`` samples of sample-first arrays -> the feeds the model takes."""
        step = 1 if self.per_sample else (self.fixed or n)
        moved = dict(self.moved)
        for a in range(0, n, step):
            b = min(a + step, n)
            yield Batch(
                {
                    k: v[a] if k in self.per_sample else np.moveaxis(v[a:b], 0, moved.get(k, 0))
                    for k, v in chunk.items()
                },
                b - a,
            )


def plan_layout(
    inputs: list[TensorSpec],
    shapes: Mapping[str, tuple[int, ...]],
    requested: int | None,
    where: str,
) -> Layout:
    """The one batch-axis rule, from each input's data shape (sample axis first) and rank.

    Data rank == model rank: the sample axis is the model's batch axis. Data rank == model
    rank + 1: the model has no batch axis, one sample per feed. Anything else is an error.
    """
    per_sample: set[str] = set()
    fixed: dict[str, int] = {}
    named: dict[str, list[tuple[str, int]]] = {}  # named dim -> (input, its size in the data)
    moved = _moved_batch_axes(inputs)
    for spec in inputs:
        shape, rank = tuple(shapes[spec.name]), len(spec.shape)
        if len(shape) == rank + 1:
            per_sample.add(spec.name)
            pairs = zip(shape[1:], spec.shape)
        elif len(shape) == rank and rank > 0 and spec.name in moved:
            axis = moved[spec.name]
            pairs = zip(shape[1:], (*spec.shape[:axis], *spec.shape[axis + 1 :]))
        elif len(shape) == rank and rank > 0:
            pairs = zip(shape[1:], spec.shape[1:])
            if isinstance(spec.shape[0], int):
                fixed[spec.name] = spec.shape[0]
        else:
            ranks = f"rank {rank} (first axis = the model's batch axis) or " if rank else ""
            raise QuantbenchError(
                f"{where}[{spec.name}]: data of shape {list(shape)} does not fit model input "
                f"{spec.describe()}: give {ranks}rank {rank + 1} (a sample axis first, one "
                "sample per feed)"
            )
        pairs = list(pairs)
        if any(isinstance(w, int) and h != w for h, w in pairs):
            raise QuantbenchError(
                f"{where}[{spec.name}]: data of shape {list(shape)} does not match model input "
                f"{spec.describe()} (sample axis first)"
            )
        for dim, size in {d: h for h, d in pairs if isinstance(d, str)}.items():
            named.setdefault(dim, []).append((spec.name, size))
    _check_named_dims(named, where)
    sizes = sorted(set(fixed.values()))
    if len(sizes) > 1:
        listed = ", ".join(f"{k}: {v}" for k, v in fixed.items())
        raise QuantbenchError(f"{where}: model inputs have different fixed batch sizes ({listed})")
    if per_sample:
        alone = min(per_sample)
        clash = sorted(k for k, v in fixed.items() if v != 1)
        if clash:
            raise QuantbenchError(
                f"{where}: data for {alone} has one axis more than the model input (one sample "
                f"per feed) but {clash[0]} has a fixed batch of {fixed[clash[0]]}: give every "
                "input's data the same layout"
            )
        if requested not in (None, 1):
            raise QuantbenchError(
                f"{where}: --batch-size {requested} cannot be used: the data for {alone} has one "
                "axis more than the model input (the model has no batch axis), so samples are "
                "fed one at a time"
            )
        return Layout(frozenset(per_sample), None, 1)
    kept = tuple(sorted(moved.items()))
    if sizes:
        size = sizes[0]
        if requested is not None and requested != size:
            raise QuantbenchError(
                f"{where}: the model has a fixed batch size of {size}; --batch-size {requested} "
                "cannot be used (re-export the model with a dynamic batch dimension)"
            )
        return Layout(frozenset(), size, size, kept)
    return Layout(frozenset(), None, requested or 1, kept)


def _check_named_dims(named: Mapping[str, list[tuple[str, int]]], where: str) -> None:
    """A named dim is one size in every input that has it (ONNX's meaning of the name):
    ``src [64, 40]`` with ``src_mask [64, 30]``, both ``src_len``, otherwise fails deep in
    onnxruntime without naming the inputs. Within one input a name may repeat with other
    sizes (``[N, 3, size, size]`` fed 800 x 608 runs): only inputs are compared."""
    for dim, sizes in named.items():
        if len({size for _, size in sizes}) > 1 and len({name for name, _ in sizes}) > 1:
            listed = ", ".join(f"{name}: {size}" for name, size in sizes)
            raise QuantbenchError(
                f"{where}: inputs sharing the dim {dim!r} have different sizes for it "
                f"({listed}); give them data of one size"
            )


def _moved_batch_axes(inputs: list[TensorSpec]) -> dict[str, int]:
    """Inputs whose batch axis is not their first: the named dim the other inputs start with
    (``batch``) found further in, behind a fixed one (PyTorch's LSTM/GRU states
    ``[layers, batch, hidden]``, which read the first axis as a fixed batch of ``layers``)."""
    firsts = {spec.shape[0] for spec in inputs if spec.shape and isinstance(spec.shape[0], str)}
    if len(firsts) != 1:
        return {}
    batch = firsts.pop()
    return {
        spec.name: spec.shape.index(batch)
        for spec in inputs
        if spec.shape and isinstance(spec.shape[0], int) and batch in spec.shape[1:]
    }


def _whole_batches(layout: Layout, max_samples: int | None, where: str) -> int | None:
    """A sample cap in whole batches of a fixed batch size (down, at least one batch), said
    aloud when it changes: a fixed-size feed cannot hold a partial batch."""
    if max_samples is None or not layout.fixed or max_samples % layout.fixed == 0:
        return max_samples
    capped = max(layout.fixed, max_samples - max_samples % layout.fixed)
    warn(
        f"{where}: the model has a fixed batch size of {layout.fixed}: reading {capped} samples "
        f"for --max-samples {max_samples}"
    )
    return capped


# --------------------------------------------------------------------------- non-finite samples


@dataclass
class NonFiniteSamples:
    """Input samples holding NaN or Inf, by ``source[input]`` (sample indices within that
    file, or within the stream for scripts and readers): reported, never fed silently."""

    SHOWN = 5

    first: dict[str, list[int]] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)

    def scan(
        self, where: str, chunk: Mapping[str, np.ndarray], offset: int, inputs: list[TensorSpec]
    ) -> None:
        """Record the samples of a sample-first chunk whose float inputs are not all finite."""
        for spec in inputs:
            arr = chunk[spec.name]
            if not spec.is_float or arr.size == 0:
                continue
            finite = np.isfinite(arr.reshape(arr.shape[0], -1)).all(axis=1)
            if finite.all():
                continue
            bad = (offset + np.flatnonzero(~finite)).tolist()
            key = f"{where}[{spec.name}]"
            kept = self.first.setdefault(key, [])
            kept.extend(bad[: max(0, 20 - len(kept))])
            self.count[key] = self.count.get(key, 0) + len(bad)

    def __bool__(self) -> bool:
        return bool(self.count)

    def message(self) -> str:
        parts = []
        for key, n in self.count.items():
            shown = ", ".join(map(str, self.first[key][: self.SHOWN]))
            more = ", ..." if n > self.SHOWN else ""
            parts.append(f"{key}: {n} sample(s) hold NaN/Inf (index {shown}{more})")
        return "; ".join(parts) + "; they are fed as they are: fix or drop them"


# --------------------------------------------------------------------------- data sources


@dataclass
class DataSource:
    """A validated stream of feeds for one model.

    ``batches()`` can be iterated several times (file sources re-read from disk); it yields
    :class:`Batch` feeds. ``fingerprint`` identifies the data without running inference, and
    is ``None`` where only the feeds themselves can (scripts and readers: see
    :class:`StreamFingerprint`). A file's digest is computed on a thread from the moment the
    source opens (``_fingerprint`` is then a future) and waited for where it is first read, so
    a pass that needs it only for its record (``--no-cache``) overlaps it with inference.
    Each complete pass refills ``nonfinite`` and, the first time it finds any, reports it
    through ``on_nonfinite`` (a warning by default).
    """

    description: str
    _fingerprint: str | Future[str] | None
    num_samples: int | None
    _make_batches: Callable[[NonFiniteSamples], Iterator[Batch]] = field(repr=False)
    on_nonfinite: Callable[[str], None] | None = field(default=warn, repr=False)
    nonfinite: NonFiniteSamples = field(default_factory=NonFiniteSamples)
    _reported: bool = field(default=False, repr=False)
    #: where each batch of the whole pass starts (a global sample index); ``None`` for streams
    #: (scripts, readers), which cannot be split into shards
    batch_starts: list[int] | None = field(default=None, repr=False)
    #: the data has one axis more than the model's inputs: the model has no batch axis, each
    #: feed is one sample, and so are its outputs (files and folders; streams are not known)
    unbatched: bool = False
    #: a source cut by ``sample_range``: the samples ``[first, stop)`` it holds, whole batches
    #: of the pass that start in the range asked (with a static batch, not quite that range)
    sample_span: tuple[int, int] | None = None

    @property
    def fingerprint(self) -> str | None:
        """The data's fingerprint (waits for a file digest still being computed)."""
        if isinstance(self._fingerprint, Future):
            self._fingerprint = self._fingerprint.result()
        return self._fingerprint

    @property
    def fingerprinted(self) -> bool:
        """Whether the source has a fingerprint up front (without waiting for it): a stream's
        is known only from its feeds."""
        return self._fingerprint is not None

    def batches(self) -> Iterator[Batch]:
        record = NonFiniteSamples()
        yield from self._make_batches(record)
        self.nonfinite = record
        if record and not self._reported and self.on_nonfinite is not None:
            self._reported = True
            self.on_nonfinite(record.message())

    @property
    def splittable(self) -> bool:
        return self.batch_starts is not None

    def shards(self, count: int) -> list[tuple[int, int]]:
        """At most ``count`` contiguous sample ranges ``(start, stop)`` of near-equal size, cut
        only where a batch of the whole pass starts: ``open_data(..., sample_range=r)`` on each
        feeds exactly the whole pass's batches, so their statistics merge to the whole's."""
        if self.batch_starts is None or self.num_samples is None:
            raise QuantbenchError(
                f"{self.description}: a data-loader script or Python reader is one stream and "
                "cannot be split into shards; give a .npz/.npy file, a folder or an image folder"
            )
        starts, n = self.batch_starts, self.num_samples
        k = max(1, min(count, len(starts)))
        cuts = {0, n}
        for i in range(1, k):
            at = bisect.bisect_left(starts, round(i * n / k))
            cuts.add(starts[min(at, len(starts) - 1)])
        edges = sorted(cuts)
        return list(zip(edges[:-1], edges[1:]))


#: data files are fingerprinted in blocks of this size, hashed on all cores at once
DIGEST_BLOCK = 8 << 20


def _file_digest(paths: Iterable[Path], extra: str) -> str:
    """sha256 over the files' names and the sha256 of each block of their bytes.

    A cache key: hashed block by block on every core (hashlib releases the GIL), on a thread
    started as the source opens, so it runs beside the model's loading and the session's start
    (and beside inference where nothing waits for it before the pass ends).
    A block is hashed once per process while its file is unchanged (``auto`` opens its data
    up to four times).
    """
    blocks = []
    for p in paths:
        st = p.stat()
        version = (str(p.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        blocks += [(p, start, version) for start in range(0, max(st.st_size, 1), DIGEST_BLOCK)]
    todo = [b for b in blocks if (b[2], b[1]) not in _BLOCK_DIGESTS]
    if todo:
        with ThreadPoolExecutor(min(usable_cores(), len(todo))) as pool:
            for (_, start, version), digest in zip(todo, pool.map(_block_digest, todo)):
                _BLOCK_DIGESTS[version, start] = digest
    h = hashlib.sha256(extra.encode())
    for p, start, version in blocks:
        if start == 0:
            h.update(p.name.encode())
        h.update(_BLOCK_DIGESTS[version, start])
    return h.hexdigest()


#: the thread that starts a file source's digest as it opens (DataSource.fingerprint waits)
_DIGESTING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quantbench-digest")

#: (file version, block start) -> sha256 of the block, for this process
_BLOCK_DIGESTS: dict[tuple[tuple[object, ...], int], bytes] = {}


def _block_digest(block: tuple[Path, int, object]) -> bytes:
    path, start, _ = block
    with open(path, "rb") as f:
        f.seek(start)
        return hashlib.sha256(f.read(DIGEST_BLOCK)).digest()


def open_data(
    source: str | Path | CalibrationDataReaderLike | Iterable[Mapping[str, np.ndarray]],
    inputs: list[TensorSpec],
    *,
    batch_size: int | None = None,
    max_samples: int | None = None,
    preset: str | Path | None = None,
    sample_range: tuple[int, int] | None = None,
) -> DataSource:
    """Open any supported data source for a model with the given inputs (validated).

    ``sample_range=(start, stop)`` (files, folders and image folders only): the batches of the
    whole pass that start in ``[start, stop)``, batched exactly as the whole pass batches them
    (a shard of :meth:`DataSource.shards`). A shard's ``fingerprint`` names its range, not the
    data: whoever merges the shards records the whole data's fingerprint.
    """
    if sample_range is not None and not isinstance(source, (str, Path, Mapping)):
        raise QuantbenchError(
            f"data of type {type(source).__name__}: only files, folders and dicts of arrays "
            "can be read by sample range"
        )
    if max_samples is not None and max_samples <= 0:
        raise QuantbenchError("--max-samples must be positive")
    if batch_size is not None and batch_size <= 0:
        raise QuantbenchError("--batch-size must be positive")
    if isinstance(source, Mapping):
        _note_unused_preset("the dict of arrays", preset)
        return _from_arrays(source, inputs, batch_size, max_samples, sample_range)
    if not isinstance(source, (str, Path)):
        _note_unused_preset("the Python data reader", preset)
        return _from_python(source, inputs, batch_size, max_samples)
    spec = str(source)
    path_part, _, func = spec.partition(".py:")
    if func or spec.endswith(".py"):
        script = Path(path_part + ".py") if func else Path(spec)
        if sample_range is not None:
            raise QuantbenchError(
                f"{script}: a data-loader script is one stream and cannot be read by sample range"
            )
        _note_unused_preset(str(script), preset)
        return _from_script(script, func or "load_data", inputs, batch_size, max_samples)
    path = Path(spec)
    if not path.exists():
        raise QuantbenchError(f"{path}: data file or folder not found")
    if path.is_dir():
        arrays = sorted(p for p in path.iterdir() if p.suffix in (".npy", ".npz"))
        images = [] if arrays else _image_files(path)
        if images:
            return _from_images(path, images, inputs, batch_size, max_samples, preset, sample_range)
        if not arrays:
            raise QuantbenchError(
                f"{path}: folder holds no .npy or .npz files, and no image files (subfolders "
                "searched too)"
            )
        _note_unused_preset(str(path), preset)
        return _from_array_files(path, arrays, inputs, batch_size, max_samples, sample_range)
    if path.suffix in (".npz", ".npy"):
        _note_unused_preset(str(path), preset)
        return _from_array_files(path, [path], inputs, batch_size, max_samples, sample_range)
    if path.suffix.lower() in IMAGE_SUFFIXES:
        return _from_images(path, [path], inputs, batch_size, max_samples, preset, sample_range)
    raise QuantbenchError(
        f"{path}: unsupported data file; use .npz/.npy, a folder of them, a folder of images "
        "(with --preset), or a Python data-loader script (file.py[:function])"
    )


#: (data source, preset) pairs already told that the preset is not applied to them
_TOLD_UNUSED: set[tuple[str, str]] = set()


def _note_unused_preset(where: str, preset: str | Path | None) -> None:
    """A preset given for data it does not apply to is said once, not dropped in silence (a
    command may take images and arrays: compare's --calib-data folder and --data .npz)."""
    if preset is None or (where, str(preset)) in _TOLD_UNUSED:
        return
    _TOLD_UNUSED.add((where, str(preset)))
    warn(
        f"{where}: --preset {preset} is not applied: it preprocesses image files, and this data "
        "is fed as it is"
    )


# ---- arrays (files, folders and images alike) ---------------------------------------------


def _readers_for_file(path: Path, inputs: list[TensorSpec]) -> dict[str, ArrayReader]:
    if path.suffix == ".npy":
        if len(inputs) != 1:
            raise QuantbenchError(
                f"{path}: a .npy holds one array but the model has {len(inputs)} inputs "
                f"({', '.join(s.name for s in inputs)}); use a .npz keyed by input name"
            )
        npy = MappedNpy(path)
        if npy.fortran or not npy.shape:  # rows of these are not byte ranges of the file
            return {inputs[0].name: _MemArray(_open_npy(path))}
        return {inputs[0].name: npy}
    readers: dict[str, ArrayReader] = dict(open_npz(path))
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
    sample_range: tuple[int, int] | None = None,
) -> DataSource:
    parts = [(str(f), _readers_for_file(f, inputs)) for f in files]
    return _from_readers(
        str(origin),
        parts,
        inputs,
        batch_size,
        max_samples,
        lambda n: _file_digest(files, f"arrays;max={n}"),
        sample_range=sample_range,
    )


def _from_readers(
    origin: str,
    parts: list[tuple[str, Mapping[str, ArrayReader]]],
    inputs: list[TensorSpec],
    batch_size: int | None,
    max_samples: int | None,
    fingerprint: Callable[[int], str],
    what: str = "samples",
    sample_range: tuple[int, int] | None = None,
) -> DataSource:
    """Sample-first arrays, one reader set per file, read in batches under one layout; with
    ``sample_range``, only the batches of the whole pass that start inside it."""
    layout: Layout | None = None
    counts = []
    for where, readers in parts:
        _check_names(where, set(readers), inputs, note_unused=True)
        for spec in inputs:
            _check_dtype(f"{where}[{spec.name}]", readers[spec.name].dtype, spec)
        shapes = {s.name: tuple(readers[s.name].shape) for s in inputs}
        this = plan_layout(inputs, shapes, batch_size, where)
        if layout is not None and this != layout:
            raise QuantbenchError(
                f"{where}: arrays of rank {[len(v) for v in shapes.values()]} are laid out unlike "
                f"those of {parts[0][0]}; give every file the same ranks"
            )
        layout = this
        count = _sample_count(where, shapes)
        if count:
            layout.check_count(count, where)  # batches never straddle files
        counts.append(count)
    assert layout is not None
    total = sum(counts)
    if total == 0:
        raise QuantbenchError(f"{origin}: the data set is empty (0 samples)")
    max_samples = _whole_batches(layout, max_samples, origin)
    n = min(total, max_samples) if max_samples else total
    plan = layout
    # every batch of the whole pass: (file index, position in the file, samples); batches
    # never straddle files, so a shard is a run of whole batches
    spans = list(_batch_spans(counts, n, plan.batch_size))
    offsets = [0, *itertools.accumulate(counts)]
    starts = [offsets[f] + pos for f, pos, _ in spans]
    first, stop = (0, n) if sample_range is None else sample_range
    mine: dict[int, list[tuple[int, int]]] = {}
    held: list[tuple[int, int]] = []  # the global samples [start, stop) of each batch taken
    for (index, pos, take), g in zip(spans, starts):
        if first <= g < stop:
            mine.setdefault(index, []).append((pos, take))
            held.append((g, g + take))

    def batches(record: NonFiniteSamples) -> Iterator[Batch]:
        for index, (where, readers) in enumerate(parts):
            try:
                for pos, take in mine.get(index, ()):
                    chunk = {
                        s.name: _cast(readers[s.name].read(pos, pos + take), s, where)
                        for s in inputs
                    }
                    record.scan(where, chunk, pos, inputs)
                    yield from plan.feeds(chunk, take)
            finally:
                _close(readers.values())

    if sample_range is None:
        digest = _DIGESTING.submit(fingerprint, n)
        return DataSource(
            f"{origin} ({n} {what})",
            digest,
            n,
            batches,
            batch_starts=starts,
            unbatched=bool(plan.per_sample),
        )
    span = (held[0][0], held[-1][1]) if held else (first, first)
    where = f"{origin} (samples {span[0]}-{span[1] - 1} of {n} {what})"
    return DataSource(
        where, f"range:{first}:{stop}:{n}", span[1] - span[0], batches,
        unbatched=bool(plan.per_sample), sample_span=span,
    )  # fmt: skip


def _batch_spans(counts: list[int], n: int, batch_size: int) -> Iterator[tuple[int, int, int]]:
    """(file index, position in the file, samples) of every batch of a pass over ``n``
    samples: ``batch_size`` at a time within each file, the last one of a file shorter."""
    remaining = n
    for index, count in enumerate(counts):
        pos = 0
        while remaining > 0 and pos < count:
            take = min(batch_size, count - pos, remaining)
            yield index, pos, take
            pos += take
            remaining -= take


def _sample_count(where: str, shapes: Mapping[str, tuple[int, ...]]) -> int:
    counts = {name: shape[0] for name, shape in shapes.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{k}: {v}" for k, v in counts.items())
        raise QuantbenchError(f"{where}: inputs have different sample counts ({listed})")
    return next(iter(counts.values()), 0)


def _check_names(
    origin: Path | str, names: set[str], inputs: list[TensorSpec], note_unused: bool = False
) -> None:
    """Every input has data; ``note_unused``: arrays that feed no input are said once (a
    ``labels`` array in the data file is read by nothing)."""
    want = {s.name for s in inputs}
    missing, extra = sorted(want - names), sorted(names - want)
    if missing:
        hint = f"; it has {', '.join(sorted(names)) or 'nothing'}" if names else ""
        raise QuantbenchError(
            f"{origin}: no data for model input(s) {', '.join(missing)}{hint}"
            + (f" (unexpected: {', '.join(extra)})" if extra else "")
        )
    if extra and note_unused:
        _note_unused(str(origin), tuple(extra))


@functools.cache
def _note_unused(origin: str, arrays: tuple[str, ...]) -> None:
    """Once per file and process (``auto`` opens its data up to four times)."""
    warn(f"{origin}: ignoring array(s) {', '.join(arrays)}: they feed no input of the model")


def _check_dtype(where: str, dtype: np.dtype, spec: TensorSpec) -> None:
    want = np.dtype(spec.dtype)
    if np.issubdtype(want, np.floating) and np.issubdtype(dtype, np.floating):
        return  # float64 -> float32 is cast: numpy's default dtype is not a user mistake
    if np.issubdtype(want, np.integer) and np.issubdtype(dtype, np.integer):
        return  # cast, with a range check on every batch (_cast)
    if dtype == want:
        return
    raise QuantbenchError(
        f"{where}: dtype {dtype.name} does not match model input {spec.describe()}; "
        f"convert the data to {want.name}"
    )


def _cast(arr: np.ndarray, spec: TensorSpec, where: str) -> np.ndarray:
    want = np.dtype(spec.dtype)
    if arr.dtype != want and np.issubdtype(want, np.integer) and arr.size:
        lo, hi, limits = arr.min(), arr.max(), np.iinfo(want)
        if lo < limits.min or hi > limits.max:
            raise QuantbenchError(
                f"{where}[{spec.name}]: values in [{lo}, {hi}] do not fit model input "
                f"{spec.describe()}"
            )
    return np.ascontiguousarray(arr, dtype=want)


# ---- feeds from Python (readers, iterables, scripts) --------------------------------------


def _sample_first(feed: Any, inputs: list[TensorSpec], where: str) -> Feed:
    """One yielded feed checked (names, dtypes) and cast; a scalar input gets a sample axis."""
    if not isinstance(feed, Mapping):
        raise QuantbenchError(
            f"{where}: expected a dict of input name -> array, got {type(feed).__name__}"
        )
    _check_names(where, set(feed), inputs)
    out: Feed = {}
    for spec in inputs:
        arr = np.asarray(feed[spec.name])
        _check_dtype(f"{where}[{spec.name}]", arr.dtype, spec)
        if arr.ndim == 0 and not spec.shape:
            arr = arr[None]
        out[spec.name] = _cast(arr, spec, where)
    return out


def _feeds_of(obj: Any) -> Iterator[Mapping[str, np.ndarray]]:
    if hasattr(obj, "get_next"):
        while (item := obj.get_next()) is not None:
            yield item
    else:
        yield from obj


def _stream(
    feeds: Iterator[Any],
    inputs: list[TensorSpec],
    where: str,
    batch_size: int | None,
    max_samples: int | None,
    record: NonFiniteSamples,
) -> Iterator[Batch]:
    """Yielded feeds -> model feeds, under the same layout rule as files (decided on the first
    feed, the same for all); each feed's samples are counted, cut at ``max_samples``."""
    layout: Layout | None = None
    seen = 0
    for i, feed in enumerate(feeds):
        at = f"{where} batch {i}"
        chunk = _sample_first(feed, inputs, at)
        shapes = {k: v.shape for k, v in chunk.items()}
        this = plan_layout(inputs, shapes, batch_size, at)
        if layout is None:
            layout = this
            max_samples = _whole_batches(layout, max_samples, where)
        elif this != layout:
            raise QuantbenchError(
                f"{at}: arrays of shapes {[list(s) for s in shapes.values()]} are laid out "
                f"unlike batch 0's; yield the same ranks every time"
            )
        n = _sample_count(at, shapes)
        if n == 0:
            raise QuantbenchError(f"{at}: holds no samples")
        layout.check_count(n, at)
        if max_samples is not None and seen + n > max_samples:
            n = max_samples - seen
            chunk = {k: v[:n] for k, v in chunk.items()}
        record.scan(where, chunk, seen, inputs)
        yield from layout.feeds(chunk, n)
        seen += n
        if max_samples is not None and seen >= max_samples:
            return


def _from_python(
    obj: Any, inputs: list[TensorSpec], batch_size: int | None, max_samples: int | None
) -> DataSource:
    where = type(obj).__name__
    if not (hasattr(obj, "get_next") or isinstance(obj, Iterable)):
        raise QuantbenchError(
            f"data of type {where} is neither a path, a CalibrationDataReader (get_next()), a "
            "dict of input name -> array nor an iterable of feed dicts"
        )

    def batches(record: NonFiniteSamples) -> Iterator[Batch]:
        if hasattr(obj, "get_next") and hasattr(obj, "rewind"):
            obj.rewind()  # another pass (or an earlier source) may have read it to the end
        yield from _stream(_feeds_of(obj), inputs, where, batch_size, max_samples, record)

    return DataSource(f"{where} (Python)", None, None, batches)


def _from_arrays(
    arrays: Mapping[str, Any], inputs: list[TensorSpec], batch_size: int | None,
    max_samples: int | None, sample_range: tuple[int, int] | None = None,
) -> DataSource:
    """{input name: array with the samples first}, as ``np.load`` gives an .npz: read as that
    file would be (the same layout rule, batches and checks; iterated as feeds, the dict would
    yield its names), fingerprinted from the arrays' bytes."""
    readers: dict[str, ArrayReader] = {}
    for name, value in arrays.items():
        if not isinstance(value, np.ndarray):
            raise QuantbenchError(
                f"data[{name!r}] is a {type(value).__name__}, not a numpy array: give a dict of "
                "input name -> array with the samples on the first axis"
            )
        readers[str(name)] = _MemArray(value)

    def digest(n: int) -> str:
        found = StreamFingerprint()
        found.update({name: r.read(0, n) for name, r in readers.items()})
        return found.hexdigest()

    return _from_readers("dict of arrays", [("dict of arrays", readers)], inputs, batch_size,
                         max_samples, digest, sample_range=sample_range)  # fmt: skip


def can_reread(data: object) -> bool:
    """Whether ``data`` can be read more than once: paths (files, folders, scripts) can; a
    CalibrationDataReader only with ``rewind()``; an iterable unless it is its own iterator (a
    generator)."""
    if isinstance(data, (str, Path)):
        return True
    if hasattr(data, "get_next"):
        return hasattr(data, "rewind")
    return isinstance(data, Iterable) and iter(data) is not data


def _from_script(
    path: Path,
    func: str,
    inputs: list[TensorSpec],
    batch_size: int | None,
    max_samples: int | None,
) -> DataSource:
    """A loader script's feeds. Its fingerprint is ``None``: only the feeds themselves say what
    the data is (the files it reads can change under the same script), so statistics are
    fingerprinted from the stream as it is fed and never served from the cache up front."""
    loader = load_user_object(path, func, "data-loader script")
    where = f"{path}:{func}"

    def batches(record: NonFiniteSamples) -> Iterator[Batch]:
        try:
            produced = loader() if callable(loader) else loader
            yield from _stream(_feeds_of(produced), inputs, where, batch_size, max_samples, record)
        except QuantbenchError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise QuantbenchError(f"{where}: data loader raised {exc!r}") from None

    return DataSource(where, None, None, batches)


# ---- images ------------------------------------------------------------------------------


def _image_files(folder: Path) -> list[Path]:
    """The images under ``folder`` and its subfolders (an ImageNet-style tree of class folders
    is a calibration set too), in the order of their relative paths; hidden entries skipped."""
    found = [
        p
        for p in folder.rglob("*")
        if p.suffix.lower() in IMAGE_SUFFIXES
        and not any(x.startswith(".") for x in p.relative_to(folder).parts)
        and p.is_file()
    ]
    return sorted(found, key=lambda p: p.relative_to(folder).parts)


class _ImageArray:
    """Image files through a preset, read as a sample-first array (one image per sample).

    ``free_axes``: axes of one image where the model's input ``spec`` is dynamic (a text
    detector's height and width). Images may differ there when they are read one at a time;
    the array's ``shape`` is the first image's."""

    def __init__(self, files: list[Path], preset: Preset, spec: TensorSpec):
        self.files, self.preset = files, preset
        first = preset.apply(files[0])
        self.shape: tuple[int, ...] = (len(files), *first.shape)
        self.dtype: np.dtype = first.dtype
        dims = spec.shape[-first.ndim :] if len(spec.shape) >= first.ndim else ()
        self.free_axes = frozenset(a for a, d in enumerate(dims) if not isinstance(d, int))

    def read(self, start: int, stop: int) -> np.ndarray:
        samples = [(f, self.preset.apply(f)) for f in self.files[start:stop]]
        for f, x in samples:
            self._check_shape(f, x.shape)
        (f, x), odd = samples[0], [s for s in samples if s[1].shape != samples[0][1].shape]
        if odd:
            g, y = odd[0]
            raise QuantbenchError(
                f"{g}: preset {self.preset.label} makes it {list(y.shape)} and {f.name} "
                f"{list(x.shape)}, in one batch; feed images one at a time (--batch-size 1) or "
                "give the preset one size (resize)"
            )
        return np.stack([x for _, x in samples])

    def _check_shape(self, f: Path, shape: tuple[int, ...]) -> None:
        fixed = self.shape[1:]
        differ = {a for a, (d, e) in enumerate(zip(shape, fixed, strict=False)) if d != e}
        if len(shape) == len(fixed) and differ <= self.free_axes:
            return  # the same size, or the model takes any size there (one image per feed)
        raise QuantbenchError(
            f"{f}: preset {self.preset.label} makes an image of shape {list(shape)}, unlike "
            f"{self.files[0].name}'s {list(fixed)}, and the model's input is fixed there; set "
            "resize or center_crop in the preset"
        )


def _from_images(
    origin: Path,
    files: list[Path],
    inputs: list[TensorSpec],
    batch_size: int | None,
    max_samples: int | None,
    preset: str | Path | None,
    sample_range: tuple[int, int] | None = None,
) -> DataSource:
    """An image folder feeds a single-input model whatever its input is called; a preset's
    ``name`` only says which input of a multi-input model the images were meant for."""
    if preset is None:
        raise QuantbenchError(
            f"{origin}: image data needs a preprocessing preset: --preset NAME (one of "
            f"{', '.join(preset_names()) or 'none'}) or --preset path/to/preset.toml"
        )
    p = Preset.load(preset)
    if len(inputs) != 1:
        names = [s.name for s in inputs]
        meant = f"the preset's {p.name!r} and " if p.name in names else ""
        raise QuantbenchError(
            f"{origin}: an image folder feeds one input, but the model has {len(inputs)} "
            f"({', '.join(names)}); feed {meant}the others from a .npz keyed by input name or "
            "a data-loader script"
        )
    files = files[:max_samples] if max_samples else files
    where = f"{origin} (images through preset {p.label})"
    parts = [(where, {inputs[0].name: _ImageArray(files, p, inputs[0])})]
    text = preset_text(preset)[0]
    return _from_readers(
        where,
        parts,
        inputs,
        batch_size,
        max_samples,
        lambda n: _file_digest(files[:n], f"images;{text}"),
        what="images",
        sample_range=sample_range,
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
    """Samples in a feed: a :class:`Batch` knows; a plain dict's first axis is its batch."""
    if isinstance(feed, Batch):
        return feed.num_samples
    first = feed[inputs[0].name]
    return int(first.shape[0]) if first.ndim and len(inputs[0].shape) else 1


def dynamic_batch(inputs: list[TensorSpec]) -> bool:
    """Every input has a first axis and it is dynamic (-1/0/named dims are, see graph)."""
    return all(spec.shape and not isinstance(spec.shape[0], int) for spec in inputs)


def samples_first(feed: Feed, n: int) -> bool:
    """Whether every array of ``feed`` holds its ``n`` samples on its first axis (what cutting
    or joining feeds along the batch axis needs)."""
    return all(np.shape(a)[:1] == (n,) for a in feed.values())


def feed_slice(feed: Feed, start: int, stop: int) -> Batch:
    """Samples ``start:stop`` of a samples-first ``feed`` (views, not copies)."""
    return Batch({k: v[start:stop] for k, v in feed.items()}, stop - start)


def feed_parts(
    feed: Feed,
    inputs: list[TensorSpec],
    per_sample: Callable[[], int],
    budget: int,
    first: int = 1,
) -> Iterator[Feed]:
    """``feed`` cut along its batch axis into parts of at most ``budget`` bytes of exposed
    activations (``per_sample()`` bytes a sample, 0 until measured on the first part of
    ``first`` samples), or whole when it cannot be cut (a fixed batch, one sample, no batch
    axis) or fits. Statistics are exact and order-independent, so parts change no bin."""
    n = feed_num_samples(feed, inputs)
    if n <= 1 or not dynamic_batch(inputs) or not samples_first(feed, n):
        yield feed
        return
    start = 0
    while start < n:
        known = per_sample()
        stop = min(n, start + (max(1, budget // known) if known else first))
        if start == 0 and stop == n:
            yield feed
        else:
            yield feed_slice(feed, start, stop)
        start = stop


class Joined(Batch):
    """A feed :func:`joined_feeds` made of several."""


def joined_feeds(
    feeds: Iterable[Feed],
    inputs: list[TensorSpec],
    max_samples: int,
    max_elements: int,
    boundary: int = 0,
    enabled: Callable[[], bool] = lambda: True,
) -> Iterator[Feed]:
    """``feeds`` of a dynamic-batch model joined along the batch axis into feeds of at most
    ``max_samples`` samples and ``max_elements`` input values (onnxruntime's per-run cost paid
    once for several samples): consecutive feeds whose inputs agree in every other dim and in
    dtype, never across sample ``boundary``; anything else passes as it comes, and so does
    everything once ``enabled()`` turns false."""
    pending: list[Feed] = []
    count = elements = seen = 0

    def flushed() -> Iterator[Feed]:
        nonlocal pending, count, elements
        if len(pending) == 1:
            yield pending[0]
        elif pending:
            yield Joined({k: np.concatenate([f[k] for f in pending]) for k in pending[0]}, count)
        pending, count, elements = [], 0, 0

    for feed in feeds:
        n = feed_num_samples(feed, inputs)
        size = sum(np.asarray(a).size for a in feed.values())
        if not (enabled() and _joinable(feed, n)):
            yield from flushed()
            yield feed
            seen += n
            continue
        if pending and (
            not _same_sample_shapes(pending[0], feed)
            or count + n > max_samples
            or elements + size > max_elements
        ):
            yield from flushed()
        pending.append(feed)
        count, elements, seen = count + n, elements + size, seen + n
        if seen == boundary:
            yield from flushed()
    yield from flushed()


def _joinable(feed: Feed, n: int) -> bool:
    return n >= 1 and samples_first(feed, n)


def _same_sample_shapes(a: Feed, b: Feed) -> bool:
    def same(x: Any, y: Any) -> bool:
        return np.shape(x)[1:] == np.shape(y)[1:] and np.asarray(x).dtype == np.asarray(y).dtype

    return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)


def nonempty(batches: Iterable[Feed], source: DataSource) -> Iterator[Feed]:
    """``batches``, or one line naming ``source`` when it yields none."""
    empty = True
    for feed in batches:
        empty = False
        yield feed
    if empty:
        raise QuantbenchError(f"{source.description}: the data set is empty (no batches)")


def prefetched(feeds: Iterator[Feed], prepare: Callable[[Feed], T] | None = None) -> Iterator[T]:
    """``feeds`` read one ahead in a thread: the next batch is loaded (file reads, decoding,
    the non-finite check, and ``prepare(feed)`` when given, e.g. its copy to the GPU) while
    this one is inferred and binned (the host and the GPU pass)."""

    def read() -> T | None:
        feed = next(feeds, None)
        return feed if feed is None or prepare is None else prepare(feed)

    ahead = _read_ahead(read)
    while (feed := ahead.result()) is not None:
        ahead = _read_ahead(read)
        yield feed


def _read_ahead(read: Callable[[], T | None]) -> Future[T | None]:
    """``read()`` on a daemon thread. Not a ThreadPoolExecutor: its threads are joined when the
    pass stops and again at interpreter exit, so Ctrl-C waited for the read in flight (a
    loader's next sample can take seconds); a daemon thread is left behind. Reads never
    overlap: the next starts after this one's result is taken."""
    ahead: Future[T | None] = Future()

    def run() -> None:
        try:
            ahead.set_result(read())
        except BaseException as exc:  # noqa: BLE001  # raised again by result(), in the pass
            ahead.set_exception(exc)

    threading.Thread(target=run, name="quantbench-read", daemon=True).start()
    return ahead
