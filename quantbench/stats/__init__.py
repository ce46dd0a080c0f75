"""The statistics stage: exact, mergeable per-tensor histograms and their binning (host and GPU)."""
