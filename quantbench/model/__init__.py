"""The model stage: load and check ONNX graphs, constants, custom ops, >2 GiB models, FP16
widening."""
