"""The signed histogram grid every tensor is binned on (lowest layer: imports nothing)."""

#: bins per sign; the grid has ``2 * HALF_BINS`` bins.
HALF_BINS = 16384
NUM_BINS = 2 * HALF_BINS
