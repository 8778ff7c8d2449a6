# Two commands, each sets everything up on a fresh machine:
#   make demo   the main job on the bundled signal model
#   make test   the whole test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast fuzz lint setup bench clean

# Every extra that installs on a CPU machine, at the verified versions (constraints.txt).
# The shm endpoint's C extension is built by the editable install: rebuild when its sources change.
$(STAMP): pyproject.toml constraints.txt setup.py hwbackends/serve/_shmloop.c hwbackends/serve/include/hwb_shm.h hwbackends/serve/include/hwb_native.h hwb_plugins/cpu_native/hwb_ext.h
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[all,test]'
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/hwb demo

# The suite runs on TEST_WORKERS processes (pytest-xdist), one module per worker at a time
# (--dist loadscope), so a module's fixtures are built once, handed out longest first
# (tests/conftest.py MODULE_SECONDS; --no-loadscope-reorder keeps that order);
# TEST_WORKERS=0 runs it serially. Three on a 2-core machine: many tests wait (open-loop
# benches, servers, Ray, child builds) while another worker's compile uses the cores; four
# gained nothing more (docs/performance.md, "The suite's time").
TEST_WORKERS ?= 3
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q $(XDIST) --durations=25

test-fast: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q $(XDIST) -m 'not slow'

# The long differential fuzz of the layer IR and cpu.native: FUZZ_EXAMPLES models
# per property, counts written to fuzz.json; then cpu.native `fixed` bit-exact against
# fpga.hls4ml's C-simulation (FUZZ_EXAMPLES/20 models), counts in fuzz_fixed.json; then
# cpu.native on models with several inputs and outputs (Keras, torch, ONNX); then its 2-D
# layers (Conv2D, pooling, padding, inception blocks; Keras, torch, ONNX), counts in
# fuzz_conv2d.json; then the engine and router stress test at STRESS_CALLS checked calls.
FUZZ_EXAMPLES ?= 2000
STRESS_CALLS ?= 1000000
fuzz: $(STAMP)
	HWB_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) HWB_FUZZ_REPORT=fuzz.json $(PY) -m pytest -q -p no:cacheprovider tests/test_fuzz_layer_ir.py
	HWB_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) HWB_FUZZ_REPORT=fuzz_fixed.json $(PY) -m pytest -q -p no:cacheprovider tests/test_fuzz_fixed.py
	HWB_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -p no:cacheprovider tests/test_fuzz_multi_io.py
	HWB_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) HWB_FUZZ_REPORT=fuzz_conv2d.json $(PY) -m pytest -q -p no:cacheprovider tests/test_fuzz_conv2d.py
	HWB_STRESS_CALLS=$(STRESS_CALLS) $(PY) -m pytest -q -p no:cacheprovider tests/test_serve_stress.py -k many_calls

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) bench/overhead.py

clean:
	rm -rf $(VENV) .venv-cpu build *.egg-info hwbackends/serve/_shmloop*.so
