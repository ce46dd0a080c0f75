"""Calibrator registry: pure functions ``TensorStats -> amax``, looked up by name.

A method string is ``name`` or ``name:option`` (``percentile:99.9``, ``entropy:ort``). Built-in
calibrators live one per module in this package; other packages add theirs through the
entry-point group ``quantbench.calibrators`` (``name = "pkg.module:function"``) where the
function has the signature ``(stats: TensorStats, option: str | None) -> float``. An entry
point may also point at a :class:`CalibratorSpec`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from importlib.metadata import entry_points
from types import ModuleType

import numpy as np

from quantbench.errors import QuantbenchError
from quantbench.stats.tensorstats import TensorStats

CalibrateFn = Callable[[TensorStats, "str | None"], float]
#: the same amaxes for many tensors at once (one matrix product instead of one per tensor)
CalibrateManyFn = Callable[[list[TensorStats], "str | None"], list[float]]
#: raises QuantbenchError for an option the calibrator would refuse, computing nothing
CheckOptionFn = Callable[["str | None"], None]

ENTRY_POINT_GROUP = "quantbench.calibrators"
#: the method every command uses when none is given (calibrate, quantize, compare ``int8``,
#: sensitivity, recover and their CLI defaults): one place to change it. ``auto`` because no
#: single calibrator stays within 0.5 points of the best on every model of the real-model
#: corpus (benchmarks/zoo, 10 models: entropy on 4, minmax on 7, percentile and mse on 5) while
#: ``auto`` -- every candidate judged at the outputs on a slice of the data -- is on 8, with the
#: smallest mean shortfall (benchmarks/README.md).
DEFAULT_METHOD = "auto"
#: what ``auto`` falls back to when there is no data to judge on (statistics files only): the
#: single method with the smallest worst-case loss on the corpus.
DATA_FREE_METHOD = "percentile:99.99"
#: not a calibrator but a choice among them per tensor (:mod:`quantbench.choose.autocalib`);
#: reserved
#: here so that every method list and error message knows it.
AUTO = "auto"
_BUILTIN_MODULES = ("minmax", "entropy", "percentile", "mse")


@dataclass(frozen=True)
class CalibratorSpec:
    """A registered calibrator.

    ``trt_algorithm`` is the header token a TensorRT cache made from this method carries; TensorRT
    ignores a cache whose algorithm differs from the calibrator class reading it, so methods that
    TensorRT itself does not have are written as ``EntropyCalibration2`` (what trtexec ``--calib``
    reads) unless the user asks otherwise.
    """

    name: str
    fn: CalibrateFn
    description: str
    trt_algorithm: str = "EntropyCalibration2"
    default_option: str | None = None
    options: tuple[str, ...] = ()
    #: the variants ``all`` expands to (default: every option); slow niche variants stay out.
    in_all: tuple[str, ...] | None = None
    #: what a user must know about the default variant, said wherever its tables are written
    note: str = ""
    #: optional vectorised twin of ``fn`` over many tensors, giving exactly ``fn``'s amaxes
    many: CalibrateManyFn | None = None
    #: optional check of an option alone, for a calibrator whose first run is costly (an
    #: import, a precomputed matrix); without it an option is checked by a run on one value
    check: CheckOptionFn | None = None
    #: reads only a tensor's range and counts (:meth:`TensorStats.max_abs`), never its
    #: histogram: a pass for such methods alone skips binning
    ranges_only: bool = False


_REGISTRY: dict[str, CalibratorSpec] = {}
_loaded = False
#: where vectorised calibrators do their heavy array work (None: NumPy, on the host)
_TABLE_ARRAYS: ContextVar[ModuleType | None] = ContextVar("quantbench_table_arrays", default=None)


@contextmanager
def tables_on(xp: ModuleType | None) -> Iterator[None]:
    """Inside, vectorised calibrators that can run their heavy array work on ``xp`` (CuPy: the
    GPU the statistics were collected on) run it there, all of a table's tensors at once. The
    amaxes do not change: a calibrator computes its candidates' scores there and settles the
    near-ties on the host, exactly as NumPy's path does. ``None``: NumPy."""
    token = _TABLE_ARRAYS.set(xp)
    try:
        yield
    finally:
        _TABLE_ARRAYS.reset(token)


def table_arrays() -> ModuleType | None:
    """The array module of the innermost :func:`tables_on` (None: NumPy on the host)."""
    return _TABLE_ARRAYS.get()


def register(
    name: str,
    description: str,
    trt_algorithm: str = "EntropyCalibration2",
    default_option: str | None = None,
    options: tuple[str, ...] = (),
    in_all: tuple[str, ...] | None = None,
    note: str = "",
    check: CheckOptionFn | None = None,
    ranges_only: bool = False,
) -> Callable[[CalibrateFn], CalibrateFn]:
    """Decorator that adds a calibrator function to the registry under ``name``."""

    def wrap(fn: CalibrateFn) -> CalibrateFn:
        _REGISTRY[name] = CalibratorSpec(
            name, fn, description, trt_algorithm, default_option, options, in_all, note,
            check=check, ranges_only=ranges_only,
        )  # fmt: skip
        return fn

    return wrap


def register_many(name: str) -> Callable[[CalibrateManyFn], CalibrateManyFn]:
    """Decorator that adds the vectorised twin of the registered calibrator ``name``."""

    def wrap(fn: CalibrateManyFn) -> CalibrateManyFn:
        _REGISTRY[name] = replace(_REGISTRY[name], many=fn)
        return fn

    return wrap


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in _BUILTIN_MODULES:
        importlib.import_module(f"{__name__}.{module}")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            continue
        obj = ep.load()
        if isinstance(obj, CalibratorSpec):
            _REGISTRY[ep.name] = obj
        else:
            _REGISTRY[ep.name] = CalibratorSpec(ep.name, obj, getattr(obj, "__doc__", "") or "")


def available() -> list[str]:
    """Names of every registered calibrator (built-in and from entry points)."""
    _load()
    return list(_REGISTRY)


def spec(name: str) -> CalibratorSpec:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        several = " (give several with --method repeated: -m minmax -m mse)" if "," in name else ""
        raise QuantbenchError(
            f"unknown calibration method {name!r}{several}; choose one of "
            f"{', '.join(method_names())}"
        ) from None


def method_note(method: str) -> str:
    """The registered note of ``method``'s default variant (empty for other variants)."""
    if method == AUTO:
        return ""
    s, _ = parse_method(method)
    return s.note if canonical(method) == s.name else ""


def method_names() -> list[str]:
    """Every method string a user can give: each calibrator with each named variant (a numeric
    option shown as ``name:P``), then ``auto`` and ``all``."""
    _load()
    out: list[str] = []
    for s in _REGISTRY.values():
        if s.options:
            out += [s.name] + [f"{s.name}:{v}" for v in s.options if v != s.default_option]
        elif s.default_option is not None:
            out.append(f"{s.name}[:P]")
        else:
            out.append(s.name)
    return [*out, AUTO, "all"]


def check_method(method: str) -> str:
    """Canonical name of ``method`` after checking its option (its ``check``, else a run on a
    one-value histogram), so that a bad option (``entropy:5``, ``percentile:abc``) fails before
    any inference, not after it."""
    s, opt = parse_method(method)
    if s.check is not None:
        s.check(opt)
    else:
        s.fn(_probe(), opt)
    return canonical(method)


def cheap_to_check(method: str) -> bool:
    """Whether :func:`check_method` of ``method`` computes nothing (its calibrator has a
    ``check``)."""
    return parse_method(method)[0].check is not None


def warm_up(methods: list[str], xp: ModuleType | None = None) -> None:
    """Each method run once on a one-value histogram, so that its first-use costs (mse's step
    matrix, SciPy's import where an entropy tie check needs it, the kernels of a :func:`tables_on`
    device ``xp``) are paid here, on a thread beside inference, not in the first table. A
    failure is left for the table to raise."""
    with tables_on(xp):
        for method in methods:
            try:
                s, opt = parse_method(method)
                s.fn(_probe(), opt)
            except Exception:  # noqa: BLE001, S112 - the table's own call raises it again
                continue


def _probe() -> TensorStats:
    probe = TensorStats("probe")
    probe.update(np.array([1.0], dtype=np.float32))
    return probe


def parse_method(method: str) -> tuple[CalibratorSpec, str | None]:
    """Split ``name[:option]`` and check that the calibrator exists."""
    name, _, option = method.partition(":")
    s = spec(name.strip())
    opt = option.strip() or s.default_option
    if s.options and opt is not None and opt not in s.options and not _is_number(opt):
        raise QuantbenchError(
            f"method {method!r}: unknown option {opt!r}; choose one of {', '.join(s.options)}"
        )
    return s, opt


def canonical(method: str) -> str:
    """The name recorded in tables: ``percentile`` -> ``percentile:99.99``, ``entropy:trt`` ->
    ``entropy`` (a named default variant is left out, a numeric option is kept)."""
    s, opt = parse_method(method)
    if opt is None or (s.options and opt == s.default_option):
        return s.name
    return f"{s.name}:{opt}"


def all_methods() -> list[str]:
    """Every registered method, and every named variant of those that have variants."""
    out: list[str] = []
    for name in available():
        s = spec(name)
        variants = s.in_all if s.in_all is not None else (s.options or (s.default_option,))
        out.extend(canonical(name if v is None else f"{name}:{v}") for v in variants)
    return list(dict.fromkeys(out))


def expand_methods(methods: list[str]) -> list[str]:
    """Resolve ``all`` to :func:`all_methods`; canonicalise and de-duplicate the rest."""
    out: list[str] = []
    for m in methods:
        names = all_methods() if m.strip() == "all" else [m]
        for name in names:
            c = canonical(name)
            if c not in out:
                out.append(c)
    return out


def ranges_suffice(methods: list[str]) -> bool:
    """Whether every one of ``methods`` (canonical names, ``auto`` not among them) reads
    ranges only, so that their statistics need no histogram."""
    return bool(methods) and all(m != AUTO and parse_method(m)[0].ranges_only for m in methods)


def compute_amax(method: str, stats: TensorStats) -> float:
    """amax of one tensor by one method; 0.0 for a tensor that never held a finite value."""
    return compute_amaxes(method, [stats])[0]


def compute_amaxes(method: str, stats: list[TensorStats]) -> list[float]:
    """:func:`compute_amax` of every tensor of ``stats``, through the calibrator's vectorised
    twin where it has one (a table of ``mse`` is one matrix product, not one per tensor)."""
    s, opt = parse_method(method)
    amax = [0.0] * len(stats)
    live = [i for i, t in enumerate(stats) if t.count and t.max_abs]
    if s.many is None:
        values = [float(s.fn(stats[i], opt)) for i in live]
    else:
        values = [float(v) for v in s.many([stats[i] for i in live], opt)]
    for i, v in zip(live, values, strict=True):
        amax[i] = _as_float32_range(v)
    return amax


#: the largest float32. A threshold above it (a bin edge past a range that reaches it, as an
#: attention mask of finfo(float32).min does) clips no float32 value more than this one, and
#: would have no finite float32 scale.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _as_float32_range(amax: float) -> float:
    return FLOAT32_MAX if amax > FLOAT32_MAX else float(amax)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
