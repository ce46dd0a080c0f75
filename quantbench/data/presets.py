"""Image preprocessing presets: the ``[input]`` table of a TOML file (packaged ones in
``quantbench.configs``), every value checked, and one image file through it.

A preset says how an image folder becomes a model's input (``--data FOLDER --preset NAME``):
colours (RGB, BGR, GRAY), resize (shorter side, fixed size, or fitted with its aspect ratio kept
and padded), center crop, scale, mean/std, layout and dtype. Reading folders and batching stay
in :mod:`quantbench.data.sources`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (Ubuntu 22.04, TensorRT's containers): the same parser as a package
    import tomli as tomllib

from quantbench.errors import QuantbenchError

_PRESET_KEYS = (
    "name",
    "layout",
    "colour",
    "color",
    "resize",
    "resize_shorter",
    "resize_longer",
    "size_multiple",
    "center_crop",
    "scale",
    "mean",
    "std",
    "dtype",
    "keep_aspect",
    "pad_value",
    "pad_align",
)
_PRESET_DTYPES = ("float32", "float16", "float64", "uint8")


def preset_root() -> Any:
    """The packaged presets (``quantbench.configs``, a Traversable); a source tree run without
    installing keeps them in the repository's ``configs/`` beside the package."""
    try:
        return resources.files("quantbench.configs")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "configs"


def preset_names() -> list[str]:
    return sorted(
        p.name[: -len(".toml")] for p in preset_root().iterdir() if p.name.endswith(".toml")
    )


def preset_text(preset: str | Path) -> tuple[str, str]:
    """(text, where it came from) of a packaged preset name or a ``.toml`` path."""
    if Path(preset).suffix:
        path = Path(preset)
        if not path.is_file():
            raise QuantbenchError(f"{path}: preset file not found")
        return path.read_text(), str(path)
    found = preset_root().joinpath(f"{preset}.toml")
    if not found.is_file():
        known = ", ".join(preset_names()) or "none"
        raise QuantbenchError(f"preset {preset}: not found (a .toml path or one of: {known})")
    return found.read_text(), str(found)


class _Check:
    """Typed reads of one preset's ``[input]`` table; a bad value is one line naming the key."""

    def __init__(self, table: Mapping[str, Any], source: str):
        self.table, self.source = table, source

    def fail(self, key: str, expected: str) -> QuantbenchError:
        return QuantbenchError(
            f"{self.source}: [input] {key} = {self.table[key]!r} is not valid: expected {expected}"
        )

    def choice(self, key: str, options: tuple[str, ...], default: str) -> str:
        v = self.table.get(key, default)
        if not isinstance(v, str) or v.upper() not in options:
            raise self.fail(key, " or ".join(f'"{o}"' for o in options))
        return v.upper()

    def size(self, key: str) -> tuple[int, int] | None:
        v = self.table.get(key)
        if v is None:
            return None
        items = [v] * 2 if _is_int(v) else v
        if not isinstance(items, list) or len(items) != 2 or not all(_is_int(x) for x in items):
            raise self.fail(key, "a positive integer or [height, width]")
        if min(items) <= 0:
            raise self.fail(key, "sizes > 0")
        return int(items[0]), int(items[1])

    def positive_int(self, key: str) -> int | None:
        v = self.table.get(key)
        if v is not None and not (_is_int(v) and v > 0):
            raise self.fail(key, "a positive integer")
        return v

    def number(self, key: str, default: float) -> float:
        v = self.table.get(key, default)
        if not _is_number(v) or not math.isfinite(v) or v == 0:
            raise self.fail(key, "a finite non-zero number")
        return float(v)

    def per_channel(
        self, key: str, default: float, nonzero: bool, channels: int = 3
    ) -> tuple[float, ...]:
        v = self.table.get(key, [default] * channels)
        items = [v] * channels if _is_number(v) else v
        ok = (
            isinstance(items, list)
            and len(items) == channels
            and all(_is_number(x) and math.isfinite(x) and (x != 0 or not nonzero) for x in items)
        )
        if not ok:
            what = "non-zero " if nonzero else ""
            many = f"{channels} finite {what}numbers (one per colour channel) or one"
            raise self.fail(key, many if channels > 1 else f"one finite {what}number")
        return tuple(float(x) for x in items)

    def boolean(self, key: str, default: bool) -> bool:
        v = self.table.get(key, default)
        if not isinstance(v, bool):
            raise self.fail(key, "true or false")
        return v


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_PAD_ALIGNS = ("CENTER", "TOP-LEFT")


@dataclass
class Preset:
    """Image preprocessing from a preset's ``[input]`` table: colours (RGB, BGR or GRAY),
    resize (shorter or longer side, sides to a multiple, then [h, w], or with ``keep_aspect``
    into [h, w] and padded: a detector's letterbox, a text line for a recognizer), center
    crop, ``x * scale``, ``(x - mean) / std``, layout (NCHW, NHWC, or FLAT: one axis in
    row-major H, W, C order), dtype."""

    name: str | None = None
    layout: str = "NCHW"
    colour: str = "RGB"
    resize: tuple[int, int] | None = None
    resize_shorter: int | None = None
    #: the longer side scaled to this, the aspect ratio kept (a text detector's limit)
    resize_longer: int | None = None
    #: each side then resized to the nearest multiple of this (a detector's stride, e.g. 32)
    size_multiple: int | None = None
    center_crop: tuple[int, int] | None = None
    scale: float = 1.0 / 255.0
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    dtype: str = "float32"
    keep_aspect: bool = False
    pad_value: tuple[float, ...] = (0.0, 0.0, 0.0)  # pixel units, before scale, mean and std
    pad_align: str = "CENTER"
    source: str = ""

    @classmethod
    def load(cls, preset: str | Path) -> Preset:
        """A packaged preset by name (``imagenet``) or a ``.toml`` file, every value checked."""
        text, source = preset_text(preset)
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise QuantbenchError(f"{source}: invalid TOML ({exc})") from None
        table = doc.get("input")
        if not isinstance(table, dict):
            raise QuantbenchError(f"{source}: no [input] table (see the imagenet preset)")
        unknown = sorted(set(table) - set(_PRESET_KEYS))
        if unknown:
            raise QuantbenchError(
                f"{source}: unknown key [input] {unknown[0]} (known: {', '.join(_PRESET_KEYS)})"
            )
        check = _Check(table, source)
        name = table.get("name")
        if name is not None and not isinstance(name, str):
            raise check.fail("name", "a tensor name (a string)")
        dtype = table.get("dtype", "float32")
        if dtype not in _PRESET_DTYPES:
            raise check.fail("dtype", " or ".join(f'"{d}"' for d in _PRESET_DTYPES))
        colour_key = "color" if "color" in table and "colour" not in table else "colour"
        colour = check.choice(colour_key, ("RGB", "BGR", "GRAY"), "RGB")
        channels = 1 if colour == "GRAY" else 3
        resize = check.size("resize")
        keep_aspect = check.boolean("keep_aspect", False)
        if keep_aspect and resize is None:
            raise check.fail("keep_aspect", "resize = [height, width] beside it (the box to fit)")
        padding = [k for k in ("pad_value", "pad_align") if k in table]
        if padding and not keep_aspect:
            raise check.fail(padding[0], "keep_aspect = true beside it (only it pads)")
        return cls(
            name=name,
            layout=check.choice("layout", ("NCHW", "NHWC", "FLAT"), "NCHW"),
            colour=colour,
            resize=resize,
            resize_shorter=check.positive_int("resize_shorter"),
            resize_longer=check.positive_int("resize_longer"),
            size_multiple=check.positive_int("size_multiple"),
            center_crop=check.size("center_crop"),
            scale=check.number("scale", 1.0 / 255.0),
            mean=check.per_channel("mean", 0.0, nonzero=False, channels=channels),
            std=check.per_channel("std", 1.0, nonzero=True, channels=channels),
            dtype=dtype,
            keep_aspect=keep_aspect,
            pad_value=check.per_channel("pad_value", 0.0, nonzero=False, channels=channels),
            pad_align=check.choice("pad_align", _PAD_ALIGNS, "CENTER"),
            source=source,
        )

    @property
    def label(self) -> str:
        return Path(self.source).stem

    def apply(self, path: Path) -> np.ndarray:
        """One image file -> one sample ([C,H,W] or [H,W,C])."""
        from PIL import Image

        try:
            img = Image.open(path).convert("L" if self.colour == "GRAY" else "RGB")
        except Exception as exc:  # noqa: BLE001
            raise QuantbenchError(f"{path}: not a readable image ({exc})") from None
        img = self._rescaled(img)
        if self.resize and self.keep_aspect:
            x = self._fit_and_pad(img)
        else:
            if self.resize:
                img = img.resize((self.resize[1], self.resize[0]), Image.Resampling.BILINEAR)
            x = np.asarray(img, dtype=np.float32).reshape(img.size[1], img.size[0], -1)
        if self.center_crop:
            x = self._crop(x, path)
        x = x * np.float32(self.scale)
        if self.colour == "BGR":
            x = x[..., ::-1]
        x = (x - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        if self.layout == "NCHW":
            x = x.transpose(2, 0, 1)
        elif self.layout == "FLAT":  # an MLP's [N, H*W*C]: a 28x28 GRAY digit as 784 values
            x = x.reshape(-1)
        return np.ascontiguousarray(x, dtype=self.dtype)

    def _rescaled(self, img: Any) -> Any:
        """The sides scaled (shorter or longer side to a length, aspect kept), then each
        resized to a multiple (a detector's stride), in that order, where the preset says."""
        from PIL import Image

        w, h = img.size
        if self.resize_shorter:
            s = self.resize_shorter / min(w, h)
            w, h = round(w * s), round(h * s)
        if self.resize_longer:
            s = self.resize_longer / max(w, h)
            w, h = max(1, round(w * s)), max(1, round(h * s))
        if self.size_multiple:
            m = self.size_multiple
            w, h = max(m, round(w / m) * m), max(m, round(h / m) * m)
        return img if (w, h) == img.size else img.resize((w, h), Image.Resampling.BILINEAR)

    def _fit_and_pad(self, img: Any) -> np.ndarray:
        """The image scaled to fit inside ``resize`` with its aspect ratio kept, then padded
        with ``pad_value`` to exactly that size (centred, or at the top left)."""
        from PIL import Image

        assert self.resize is not None
        h, w = self.resize
        s = min(h / img.size[1], w / img.size[0])
        nw, nh = max(1, min(w, round(img.size[0] * s))), max(1, min(h, round(img.size[1] * s)))
        fitted = np.asarray(img.resize((nw, nh), Image.Resampling.BILINEAR), dtype=np.float32)
        channels = len(self.pad_value)
        out = np.empty((h, w, channels), np.float32)
        out[...] = np.asarray(self.pad_value, np.float32)
        top, left = ((h - nh) // 2, (w - nw) // 2) if self.pad_align == "CENTER" else (0, 0)
        out[top : top + nh, left : left + nw] = fitted.reshape(nh, nw, channels)
        return out

    def _crop(self, x: np.ndarray, path: Path) -> np.ndarray:
        assert self.center_crop is not None
        ch, cw = self.center_crop
        h, w = x.shape[:2]
        if ch > h or cw > w:
            raise QuantbenchError(
                f"{path}: preset {self.label} crops {ch}x{cw} from an image of {h}x{w} "
                "(after resizing); resize it larger first"
            )
        top, left = (h - ch) // 2, (w - cw) // 2
        return x[top : top + ch, left : left + cw]
