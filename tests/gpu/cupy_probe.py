"""CuPy with a usable GPU, or why not: the skip condition of the GPU tests that need CuPy."""

from __future__ import annotations

from types import ModuleType


def cupy_or_reason() -> tuple[ModuleType | None, str | None]:
    """(cupy, None) where CuPy imports and sees a CUDA device, else (None, the reason)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None, "no CUDA device"
        return cupy, None
    except Exception as exc:  # noqa: BLE001 - any failure means: no usable CuPy here
        return None, f"CuPy unusable: {type(exc).__name__}: {exc}"
