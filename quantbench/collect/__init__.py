"""The collection stage: the onnxruntime pass that fills the statistics, sharded or on a GPU."""
