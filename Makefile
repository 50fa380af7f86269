# The two commands of the README (`make demo`, `make test`) do all set-up themselves.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch/torchvision wheels that this machine keeps on disk; override for other platforms.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.gawee-installed

.PHONY: accel demo test zoo speed soundness bench bench-int8 bench-int8-static bench-bf16 lint format clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The rewrite engine's hot modules compiled with Cython (gawee/accel.py): only those whose source changed since
# their build are compiled again (a minute at most); without a C compiler they run interpreted, as before.
accel: $(STAMP)
	$(VENV)/bin/gawee-rewrite accel build

demo: accel
	$(VENV)/bin/gawee-rewrite optimize resnet18 --bench

# pytest-xdist: one worker per core (the soundness harness is Python-bound); TEST_WORKERS=0 runs in one process.
# PYTEST_ARGS go to pytest: .ci/run passes --require-renderers (the picture tests fail, not skip, without
# Chromium or Graphviz); e.g. make test PYTEST_ARGS="-k rules -x".
TEST_WORKERS ?= 2
PYTEST_ARGS ?=
test: accel
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

# Model zoo (benchmarks/README.md, ## Model zoo and ## Model zoo: transformers); e.g. make zoo ZOO_ARGS="--section transformers"
# With the IREE column when IREE is installed (the dev extra has it): ZOO_ARGS="--no-iree" skips it.
zoo: $(STAMP)
	$(PY) benchmarks/zoo.py $(ZOO_ARGS)

speed: accel
	$(PY) benchmarks/engine_speed.py $(SPEED_ARGS)

soundness: $(STAMP)
	$(PY) benchmarks/soundness.py $(SOUNDNESS_ARGS)

# Runtime benchmark (see benchmarks/README.md, ## Runtime); e.g. make bench BENCH_ARGS="--models resnet18 --batches 1"
BENCH_ARGS ?=
BENCH_STAMP := $(VENV)/.gawee-bench-installed
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) benchmarks/bench_runtime.py --readme $(BENCH_ARGS)

# Int8 against ONNX Runtime's quantize_dynamic (benchmarks/README.md, ## Int8: gawee against ONNX Runtime's
# quantize_dynamic): BERT-base and GPT-2, each column in a process of its own; run it on a quiet machine.
# e.g. make bench-int8 BENCH_INT8_ARGS="--interleave --models bert --reps 30"; a smoke run without the README:
# $(PY) benchmarks/bench_int8.py --tiny --models bert --reps 3 --warmup 1 --passes 1
BENCH_INT8_ARGS ?= --interleave --rounds 2 --reps 40 --passes 8
bench-int8: $(BENCH_STAMP)
	$(PY) benchmarks/bench_int8.py --readme $(BENCH_INT8_ARGS)

# Static int8 convolutions against OpenVINO's int8 model from NNCF post-training quantization, both calibrated on the
# same batches (benchmarks/README.md, ## Static int8: gawee against OpenVINO with NNCF): resnet50 and
# mobilenet_v3_large; e.g. make bench-int8-static BENCH_INT8_STATIC_ARGS="--interleave --models resnet50"
BENCH_INT8_STATIC_ARGS ?= --interleave --rounds 2
bench-int8-static: $(BENCH_STAMP)
	$(PY) benchmarks/bench_int8_static.py --readme $(BENCH_INT8_STATIC_ARGS)

# bf16 against OpenVINO bf16 and Inductor's bf16 autocast (benchmarks/README.md, ## bf16: gawee against OpenVINO and
# Inductor); e.g. make bench-bf16 BENCH_BF16_ARGS="--interleave --models resnet50"
BENCH_BF16_ARGS ?= --interleave --rounds 2
bench-bf16: $(BENCH_STAMP)
	$(PY) benchmarks/bench_bf16.py --readme $(BENCH_BF16_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache
