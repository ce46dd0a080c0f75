"""Where the dense 3x3 C=128 FP32 time goes: our library's cuDNN path against torch's cuDNN.

Issue 39's last dense figure: 165.7 us (our library, cuDNN's FFT engine) against torch's 135.8 us
on an H100, 1.22x for a target of 1.2x; the plan itself times the engine at about 148 us. The
suspects are the bias (ours fills y with it, then the convolution blends with beta = 1; torch
runs the convolution with beta = 0 and adds the bias after) and the workspace allocated inside the
CUDA graph (a stream-ordered allocation per forward while capturing). This times, for the shape
with and without its bias, our forward and torch's ``F.conv2d`` each replayed from a CUDA graph
(the harness's ``time_cuda``, rotated buffers, as run_gpu_checks.py) and launched eagerly (no
graph, hence no graph allocation), checks both against float64, and lists the kernels of each
call with torch.profiler. One library per process (the plan cache is process-wide):

    QUANTBENCH_DWCONV_LIB=.../libdwconv2d_kernels.so python3 tests/gpu/dense_bias_probe.py shipped

``$QUANTBENCH_DWCONV_CUDNN_F32_POST`` picks the FP32 bias route the plan may take
(kernels/cudnn.cuh, read at the first plan): 0 the blends (bias filled into y, convolution with
beta = 1), 2 the post plans (convolution with beta = 0 into y, then our bias pass in place, as
torch), 1 both timed and the faster kept; tests/gpu/device_session.sh step ``denseprobe`` runs
this once with each. Prints one ``PROBE {json}`` line and writes ``$OUT/dense_probe_TAG.json``
where ``$OUT`` is set.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dwconv_gpu_harness as harness  # noqa: E402  (sibling helper module)

CASE = "dense3x3_c128"


def eager_us(fn: Callable[[], None], warmup: int = 5, reps: int = 30, inner: int = 10) -> float:
    """Median over ``reps`` of the mean of ``inner`` calls launched one by one (no graph)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / inner)
    return statistics.median(samples)


def kernel_table(fn: Callable[[], None], label: str, calls: int = 5) -> float:
    """The GPU kernels of ``calls`` eager calls (torch.profiler), printed per call; their sum."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        total = getattr(ev, "device_time_total", None)
        if total is None:
            total = getattr(ev, "cuda_time_total", 0)
        if total and total > 0:
            rows.append((total / calls, ev.count / calls, ev.key[:110]))
    rows.sort(reverse=True)
    print(f"--- {label}: kernels per call (us, launches)")
    for t, count, key in rows[:12]:
        print(f"{t:9.1f} {count:5.1f}  {key}")
    return sum(r[0] for r in rows)


def probe(tag: str) -> dict[str, Any]:
    import torch

    lib = harness.get_library()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(1)
    with_bias = harness.BENCH_CASES[CASE]
    res: dict[str, Any] = {
        "tag": tag,
        "library": os.environ.get(harness.LIBRARY_ENV),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
    }
    pairs = {}
    for label, spec in (
        ("bias", with_bias),
        ("nobias", dataclasses.replace(with_bias, bias_mode=harness.kl.BIAS_NONE)),
    ):
        out_elems = 1
        for d in spec.output_shape:
            out_elems *= d
        first = harness.device_inputs(spec, "f32", gen)
        moved = (first[0].numel() + first[1].numel() + out_elems) * 4
        sets = [first] + [
            harness.device_inputs(spec, "f32", gen) for _ in range(harness.rotation_sets(moved) - 1)
        ]
        outs = [torch.empty(spec.output_shape, device="cuda") for _ in sets]
        params = spec.to_params()
        turn = {"ours": 0, "torch": 0}

        def launch(i: int, sets: list = sets, outs: list = outs, params: Any = params) -> None:
            code = harness.launch(lib, "f32", sets[i], outs[i], params,
                                  torch.cuda.current_stream().cuda_stream)  # fmt: skip
            if code != 0:
                raise RuntimeError(f"CUDA error {code}")

        def ours(turn: dict = turn, sets: list = sets, launch: Callable = launch) -> None:
            turn["ours"] += 1
            launch(turn["ours"] % len(sets))

        def theirs(turn: dict = turn, sets: list = sets, spec: Any = spec) -> None:
            turn["torch"] += 1
            harness.torch_conv(spec, *sets[turn["torch"] % len(sets)])

        launch(0)
        res[f"path_{label}"] = lib.last_path()
        x, w, b = sets[0]
        ref = harness.torch_conv(spec, x.double(), w.double(), None if b is None else b.double())
        theirs_y = harness.torch_conv(spec, x, w, b)
        torch.cuda.synchronize()
        scale = ref.abs().max().item()
        res[f"ours_err_{label}"] = (outs[0].double() - ref).abs().max().item() / scale
        res[f"torch_err_{label}"] = (theirs_y.double() - ref).abs().max().item() / scale
        res[f"rotated_sets_{label}"] = len(sets)
        res[f"ours_graph_{label}_us"] = harness.time_cuda(ours)
        res[f"ours_eager_{label}_us"] = eager_us(ours)
        res[f"torch_graph_{label}_us"] = harness.time_cuda(theirs)
        res[f"torch_eager_{label}_us"] = eager_us(theirs)
        pairs[label] = (ours, theirs)
    for label, (ours, theirs) in pairs.items():
        res[f"ours_kernels_{label}_us"] = kernel_table(ours, f"{tag} ours, {label}")
        res[f"torch_kernels_{label}_us"] = kernel_table(theirs, f"{tag} torch, {label}")
    return res


def main(argv: list[str]) -> int:
    reason = harness.gpu_unavailable_reason()
    if reason is not None:
        print(f"dense_bias_probe: {reason}", file=sys.stderr)
        return 2
    tag = argv[0] if argv else "lib"
    res = probe(tag)
    print("PROBE " + json.dumps(res))
    out = os.environ.get("OUT")
    if out:
        Path(out, f"dense_probe_{tag}.json").write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
