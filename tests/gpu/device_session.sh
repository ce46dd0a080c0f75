#!/usr/bin/env bash
# One device call for issue 39 (see plugins/dwconv2d/README.md): install the carried wheels and
# the project into /tmp/site (skipped when a warm machine has them), build the kernel library,
# then run the steps named in $@ (default: optest real checks), each under its own timeout;
# speed16: issue 37's ResNet-18-shaped row of bench_speed.py on the host's 16 cores; denseprobe:
# tests/gpu/dense_bias_probe.py with each FP32 bias route ($QUANTBENCH_DWCONV_CUDNN_F32_POST=0
# blend, 2 post, 1 both timed and the faster kept; each PROBE line and kernel table in its log);
# sanitizecudnn: memcheck of the cuDNN path's bias pass; checkspost: the correctness grid again with
# the FP32 post plans forced (QUANTBENCH_DWCONV_CUDNN_F32_POST=2; `checks` runs the default route),
# into $OUT/post. pipefail: a step's "rc=" is its program's exit status, not that of the `tail` after it.
# A library built here and carried (plugins/dwconv2d/build, newer than its sources) is not rebuilt.
# Carry: .whl (onnxruntime-extensions cp312, onnx-graphsurgeon) and .dwreal (model + data).
# onnxruntime-gpu (realcuda) is too large for one call: earlier calls leave the parts of an
# xz'd tar of its unpacked wheel in /root/ortp (`cp .ortp/p*/ort.part* /root/ortp/`, one folder
# .ortp/pNN carried a call, back to back); it is unpacked into /tmp/ortgpu, ahead of the device's
# own CPU onnxruntime.
set -u -o pipefail
OUT=${OUT:-/tmp/out}
# unpacked only for a step that needs it (an earlier call may have left only some of the parts),
# into a scratch folder first, so that a failed unpack leaves no half /tmp/ortgpu behind
case " $* " in *" realcuda "*) want_ort=1 ;; *) want_ort=0 ;; esac
if [ $want_ort = 1 ] && ls /root/ortp/ort.part* > /dev/null 2>&1 && [ ! -d /tmp/ortgpu/onnxruntime ]; then
  rm -rf /tmp/ortgpu.new && mkdir -p /tmp/ortgpu.new && cat /root/ortp/ort.part* \
    | python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" \
    | tar x -C /tmp/ortgpu.new && mv /tmp/ortgpu.new /tmp/ortgpu || exit 5
fi
# onnxruntime's preload_dlls looks for the nvidia-* wheels (CUDA 13: nvidia/cu13/lib, nvidia/cudnn/lib)
# beside its own package, i.e. in /tmp/ortgpu: link the device's (torch's) nvidia folder there
if [ -d /tmp/ortgpu/onnxruntime ] && [ ! -e /tmp/ortgpu/nvidia ]; then
  nv=$(python3 -c "import nvidia, os; print(next(p for p in nvidia.__path__ if os.path.isdir(p + '/cudnn')))" 2>/dev/null) && [ -d "$nv" ] && ln -s "$nv" /tmp/ortgpu/nvidia
fi
if [ ! -d /tmp/site/onnxruntime_extensions ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 3
  python3 -m pip install -q --no-deps --no-build-isolation --no-compile --target /tmp/site . > "$OUT/install.log" 2>&1 \
    || echo "project install failed (see install.log)"
fi
export PYTHONPATH=$PWD:/tmp/ortgpu:/tmp/site
python3 -c "import onnxruntime as o; getattr(o, 'preload_dlls', print)(); print('onnxruntime', o.__version__, o.get_available_providers())"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
uptime
make -s -C plugins/dwconv2d -j16 || exit 4
export QUANTBENCH_DWCONV_LIB=$PWD/plugins/dwconv2d/build/libdwconv2d_kernels.so
for step in "${@:-optest real checks}"; do
  for s in $step; do
    echo "=== $s $(date +%T)"
    case $s in
      optest) timeout 150 python3 -m pytest -q -rs -m gpu --noconftest -p no:cacheprovider tests/gpu/test_dwconv_ort_op.py ;;
      kernels) timeout 200 python3 -m pytest -q -m gpu --noconftest -p no:cacheprovider tests/gpu/test_dwconv_kernels.py tests/gpu/test_dwconv_reference.py | tail -5 ;;
      real) PYTHONUNBUFFERED=1 timeout 300 python3 benchmarks/dwconv_real_model.py --model .dwreal/mobilenet_v2.onnx \
              --calib .dwreal/calib.npz --eval .dwreal/eval.npz --device cuda --reps 30 --work /tmp/dwreal ;;
      realcuda) PYTHONUNBUFFERED=1 timeout 400 python3 benchmarks/dwconv_real_model.py --model .dwreal/mobilenet_v2.onnx \
              --calib .dwreal/calib.npz --eval .dwreal/eval.npz --device cuda --provider cuda --reps 30 \
              --work /tmp/dwrealcuda ;;
      checks) timeout 280 python3 tests/gpu/run_gpu_checks.py --out "$OUT" | tail -40 ;;
      checkspost) QUANTBENCH_DWCONV_CUDNN_F32_POST=2 timeout 200 python3 tests/gpu/run_gpu_checks.py --skip-bench \
              --out "$OUT/post" | tail -12 ;;
      bench) timeout 200 python3 tests/gpu/run_gpu_checks.py --skip-checks --out "$OUT" | tail -30 ;;
      speed16) printf '#!/bin/sh\nPYTHONPATH=%s:/tmp/site exec python3 -P -m quantbench "$@"\n' "$PWD" > /tmp/qb && chmod +x /tmp/qb
              timeout 400 python3 benchmarks/zoo/bench_speed.py --only resnet18 --repeat 3 --quantbench /tmp/qb \
                --json "$OUT/speed16.json" | tail -12 ;;
      denseprobe) # the dense FP32 bias probe, one library, each FP32 bias route forced in turn:
              # blend (bias fill + beta = 1), post (conv, then the in-place bias pass), auto (the faster)
              # ($DENSEPROBE_ROUTES: other NAME:VALUE pairs; an empty VALUE runs the library's default)
              for tag in ${DENSEPROBE_ROUTES:-blend:0 post:2 auto:1}; do
                name=${tag%%:*} v=${tag#*:}
                echo "##### $name (QUANTBENCH_DWCONV_CUDNN_F32_POST=$v)" >> "$OUT/dense_probe.log"
                env OUT= ${v:+QUANTBENCH_DWCONV_CUDNN_F32_POST=$v} QUANTBENCH_DWCONV_DEBUG=1 timeout 150 \
                  python3 tests/gpu/dense_bias_probe.py "$name" > /tmp/dense_probe_$name.log 2>&1
                cat /tmp/dense_probe_$name.log >> "$OUT/dense_probe.log"
                grep "cuDNN plan\|^PROBE\|bias_pass\|elementwise" /tmp/dense_probe_$name.log | cut -c1-1500
              done ;;
      sanitizecudnn) # memcheck of the cuDNN path's bias pass (FP32 post plans in place, FP16 scratch), then the fill
              # 16-byte vectors (784 / 256 outputs a plane), FP16 8-byte ones (196), V = 1 (99), per-batch bias
              cases=dense_k3_p1,dense_pb_k3,g2_gemm_k3,g3_kg6_d2
              QUANTBENCH_DWCONV_CUDNN_F32_POST=2 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
                python3 tests/gpu/sanitize_dwconv.py --lib "$QUANTBENCH_DWCONV_LIB" --cudnn auto --modes f32,f16 --cases $cases | tail -22
              echo "memcheck post/f16 rc=${PIPESTATUS[0]}"
              QUANTBENCH_DWCONV_CUDNN_F32_POST=0 timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 \
                python3 tests/gpu/sanitize_dwconv.py --lib "$QUANTBENCH_DWCONV_LIB" --cudnn auto --modes f32 --cases $cases | tail -12
              echo "memcheck blend rc=${PIPESTATUS[0]}" ;;
      sanitize) timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/gpu/sanitize_dwconv.py \
              --lib "$QUANTBENCH_DWCONV_LIB" --modes int8_i8,int8_f32,int8_tie,f32,f16 | tail -5 ;;
    esac
    echo "=== $s rc=$? $(date +%T)"
  done
done
