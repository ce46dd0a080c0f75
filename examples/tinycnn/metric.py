"""A task metric for quantbench's ``--metric-script`` (class form: bounded memory).

    quantbench recover examples/tinycnn/tinycnn.onnx --data examples/tinycnn/eval.npz \
        --calib-data examples/tinycnn/calib.npz --labels examples/tinycnn/eval_labels.npy \
        --metric-script examples/tinycnn/metric.py --target task_accuracy_drop=0.002 -o out/rec

``update`` sees each evaluation batch's FP32 and candidate outputs (by output name) and the
labels; ``compute`` returns the numbers (a name ending in ``_drop`` is lower-is-better).
"""

from __future__ import annotations

import numpy as np


class metric:  # noqa: N801 - quantbench looks the name up (FILE.py[:NAME], default "metric")
    def __init__(self) -> None:
        self.samples = self.fp32_correct = self.candidate_correct = 0

    def update(self, fp32: dict, candidate: dict, labels: np.ndarray | None) -> None:
        if labels is None:
            raise ValueError("this metric needs --labels")
        self.samples += len(labels)
        self.fp32_correct += int((fp32["logits"].argmax(axis=1) == labels).sum())
        self.candidate_correct += int((candidate["logits"].argmax(axis=1) == labels).sum())

    def compute(self) -> dict[str, float]:
        drop = (self.fp32_correct - self.candidate_correct) / self.samples
        return {"task_accuracy": self.candidate_correct / self.samples, "task_accuracy_drop": drop}
