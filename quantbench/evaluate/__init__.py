"""The evaluation stage: metrics, output layouts, isolated per-op drift and task metrics."""
