"""Which cuDNN engine torch picks for the dense timing shape, and its error against float64.

Run on the device with cuDNN's own log switched on, e.g.

    CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG=$OUT/cudnn.log python3 tests/gpu/cudnn_probe_dwconv.py

The last "cudnnBackendExecute" in the log is the plan torch kept; the printed error tells whether
that plan is a plain float sum (about 1e-6 of max |y|) or FFT/Winograd-like (1e-5 and more).
"""

from __future__ import annotations

import sys


def main() -> int:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(1)
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(32, 128, 28, 28, generator=gen, device="cuda").to(dtype)
        w = (torch.randn(128, 128, 3, 3, generator=gen, device="cuda") * 0.1).to(dtype)
        for _ in range(3):
            y = F.conv2d(x, w, padding=1)
        torch.cuda.synchronize()
        print(f"MARK final {dtype}", file=sys.stderr, flush=True)
        y = F.conv2d(x, w, padding=1)
        torch.cuda.synchronize()
        ref = F.conv2d(x.double(), w.double(), padding=1)
        err = (y.double() - ref).abs().max().item() / ref.abs().max().item()
        print(f"dense3x3_c128 {dtype}: torch cuDNN max|err|/max|ref| vs float64 = {err:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
