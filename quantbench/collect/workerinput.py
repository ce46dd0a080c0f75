"""What a worker needs to rebuild the driver's model and data: sent once per task batch.

Calibration shards, ``auto``'s candidate scores and recovery's evaluations all run on workers
that open the model from its bytes and the data where it is. One record holds that, with the
paths made absolute (a worker's working directory is not the driver's), and reopens both the
same way everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from quantbench.data.sources import DataSource, open_data
from quantbench.model.graph import Graph, open_graph

_GRAPHS: dict[str, Graph] = {}


@dataclass(frozen=True)
class WorkerInput:
    """The model (bytes, the driver's hash and path) and how to open the data on a worker."""

    model: bytes
    model_hash: str
    model_path: str
    data: str
    batch_size: int | None
    max_samples: int | None
    preset: str | None
    provider: str | None
    threads: int | None

    @classmethod
    def of(
        cls,
        graph: Graph,
        data: str | Path,
        *,
        batch_size: int | None,
        max_samples: int | None,
        preset: str | Path | None,
        provider: str | None,
        threads: int | None,
    ) -> WorkerInput:
        return cls(
            model=graph.source if graph.source is not None else graph.model.SerializeToString(),
            model_hash=graph.hash,
            model_path=str(graph.path or ""),
            data=str(Path(data).resolve()),
            batch_size=batch_size,
            max_samples=max_samples,
            preset=_absolute_preset(preset),
            provider=provider,
            threads=threads,
        )

    def graph(self) -> Graph:
        """The driver's graph rebuilt from its bytes, under the driver's hash and path (cached
        per worker process: a worker that runs several tasks parses the model once)."""
        cached = _GRAPHS.get(self.model_hash)
        if cached is None:
            proto = onnx.load_from_string(self.model)
            graph = open_graph(proto)
            path = Path(self.model_path) if self.model_path else None
            source = self.model if graph.model is proto else None  # unless open_graph rewrote it
            cached = replace(graph, hash=self.model_hash, path=path, source=source)
            _GRAPHS.clear()
            _GRAPHS[self.model_hash] = cached
        return cached

    def source(self, sample_range: tuple[int, int] | None = None) -> DataSource:
        """The data as the driver opened it (optionally one shard of it)."""
        return open_data(
            self.data,
            self.graph().inputs,
            batch_size=self.batch_size,
            max_samples=self.max_samples,
            preset=self.preset,
            sample_range=sample_range,
        )


def _absolute_preset(preset: str | Path | None) -> str | None:
    """A preset file path made absolute; a preset name (``imagenet``) stays a name."""
    if preset is None:
        return None
    return str(Path(preset).resolve()) if Path(preset).suffix else str(preset)
