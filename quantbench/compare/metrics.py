"""Streaming drift metrics: sums that grow with each batch, never the activations themselves.

Definitions (``a`` = reference values, ``b`` = candidate values, over every element of every
sample):

* cosine similarity = Σab / sqrt(Σa² · Σb²)
* SQNR (dB)         = 10 · log10(Σa² / Σ(a−b)²)   (higher is better; ``inf`` when identical)
* relative L2 error = sqrt(Σ(a−b)² / Σa²)
* max abs error     = max |a−b|;  mean abs error = Σ|a−b| / n
* clip fraction     = fraction of |a| above the tensor's quantization range amax (only for
  tensors the candidate quantizes)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class DriftAccumulator:
    """Running sums for one tensor pair."""

    n: int = 0
    sum_aa: float = 0.0
    sum_bb: float = 0.0
    sum_ab: float = 0.0
    sum_dd: float = 0.0
    sum_abs_d: float = 0.0
    max_abs_d: float = 0.0
    clipped: int = 0
    amax: float | None = None
    nonfinite: int = 0

    def update(self, a: np.ndarray, b: np.ndarray) -> None:
        """Add one batch. Dot products run in float32 BLAS (accumulated in float64 across
        batches): exact enough for dB-level metrics and several times cheaper than float64."""
        a32 = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
        b32 = np.ascontiguousarray(b, dtype=np.float32).reshape(-1)
        if a32.shape != b32.shape:
            raise ValueError(f"shape mismatch {np.shape(a)} vs {np.shape(b)}")
        d = a32 - b32
        sums = (float(a32 @ a32), float(b32 @ b32), float(a32 @ b32), float(d @ d))
        if not all(math.isfinite(v) for v in sums):
            finite = np.isfinite(a32) & np.isfinite(b32)
            self.nonfinite += int((~finite).sum())
            a32, b32 = a32[finite], b32[finite]
            d = a32 - b32
            sums = (float(a32 @ a32), float(b32 @ b32), float(a32 @ b32), float(d @ d))
        self.n += a32.size
        self.sum_aa += sums[0]
        self.sum_bb += sums[1]
        self.sum_ab += sums[2]
        self.sum_dd += sums[3]
        absd = np.abs(d, out=d)
        if absd.size:
            self.sum_abs_d += float(absd.sum(dtype=np.float64))
            self.max_abs_d = max(self.max_abs_d, float(absd.max()))
        if self.amax is not None and self.amax > 0:
            self.clipped += count_clipped(a32, self.amax)

    def metrics(self) -> dict[str, float | None]:
        if self.n == 0:
            return {
                k: None
                for k in ("cosine", "sqnr_db", "rel_l2", "max_abs", "mean_abs", "clip_fraction")
            }
        denom = math.sqrt(self.sum_aa * self.sum_bb)
        cosine = self.sum_ab / denom if denom > 0 else (1.0 if self.sum_dd == 0 else 0.0)
        if self.sum_dd == 0:
            sqnr = math.inf
        elif self.sum_aa == 0:
            sqnr = -math.inf
        else:
            sqnr = 10.0 * math.log10(self.sum_aa / self.sum_dd)
        rel = (
            math.sqrt(self.sum_dd / self.sum_aa)
            if self.sum_aa > 0
            else (0.0 if self.sum_dd == 0 else math.inf)
        )
        return {
            "cosine": min(1.0, max(-1.0, cosine)),
            "sqnr_db": sqnr,
            "rel_l2": rel,
            "max_abs": self.max_abs_d,
            "mean_abs": self.sum_abs_d / self.n,
            "clip_fraction": (self.clipped / self.n) if self.amax else None,
        }


@dataclass
class AgreementAccumulator:
    """Top-1 / top-5 agreement of a class-score output, and accuracy against labels."""

    samples: int = 0
    top1: int = 0
    top5: int = 0
    correct_a: int = 0
    correct_b: int = 0
    labelled: int = 0

    def update(self, a: np.ndarray, b: np.ndarray, labels: np.ndarray | None = None) -> None:
        a2, b2 = _scores(a), _scores(b)
        if a2 is None or b2 is None:
            return
        top_a = a2.argmax(axis=1)
        top_b = b2.argmax(axis=1)
        k = min(5, b2.shape[1])
        top5_b = np.argpartition(-b2, k - 1, axis=1)[:, :k]
        self.samples += a2.shape[0]
        self.top1 += int((top_a == top_b).sum())
        self.top5 += int((top5_b == top_a[:, None]).any(axis=1).sum())
        if labels is not None:
            lab = np.asarray(labels).reshape(-1)
            self.correct_a += int((top_a == lab).sum())
            self.correct_b += int((top_b == lab).sum())
            self.labelled += lab.size

    def metrics(self) -> dict[str, float | None]:
        if not self.samples:
            return {"agreement": None, "top5_agreement": None}
        return {"agreement": self.top1 / self.samples, "top5_agreement": self.top5 / self.samples}

    def accuracy(self) -> dict[str, float] | None:
        if not self.labelled:
            return None
        acc_a, acc_b = self.correct_a / self.labelled, self.correct_b / self.labelled
        return {"A": acc_a, "B": acc_b, "delta": acc_b - acc_a}


def count_clipped(values: np.ndarray, amax: float) -> int:
    """How many values lie outside [-amax, amax] (would saturate in INT8)."""
    return int(np.count_nonzero(values > amax)) + int(np.count_nonzero(values < -amax))


@dataclass
class ClipCounter:
    """Fraction of a quantized op's FP32 input beyond its amax (its clipping)."""

    amax: float
    n: int = 0
    clipped: int = 0

    def update(self, values: np.ndarray) -> None:
        self.n += values.size
        self.clipped += count_clipped(values, self.amax)

    @property
    def fraction(self) -> float | None:
        return self.clipped / self.n if self.n else None


def is_class_scores(shape: tuple[int, ...]) -> bool:
    """[N, C] (or [N, C, 1, 1]) with C > 1: an output argmax agreement makes sense for."""
    squeezed = [d for d in shape[1:] if d != 1]
    return len(shape) >= 2 and len(squeezed) == 1 and squeezed[0] > 1


def _scores(x: np.ndarray) -> np.ndarray | None:
    arr = np.asarray(x)
    if not is_class_scores(arr.shape):
        return None
    return arr.reshape(arr.shape[0], -1)
