"""The data stage: every calibration/evaluation source becomes validated feed batches."""
