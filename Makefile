# Set-up and entry points. `make demo` and `make test` create .venv on first use: the demo installs what it
# needs (torch, the package and its dependencies), the tests add the test extra on top (a second stamp).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.installed-demo
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast typecheck audit bench venv clean

venv: $(STAMP)

# torch is installed on its own first: on machines that carry a CPU wheel of torch 2.13 this
# takes it from disk; elsewhere pip resolves torch>=2.8 as usual.
$(DEMO_STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==2.13.0" || $(PY) -m pip install -q "torch>=2.8"
	$(PY) -m pip install -q -e .
	touch $(DEMO_STAMP)

# torchaudio (a parity reference for fbank) goes with --no-deps into a folder outside sys.path: each
# release pins one torch release, its compiled extension need not load beside this torch, and
# libraries that import torchaudio whenever it is installed (transformers) must not find it. Only its
# pure-Python compliance.kaldi is used (rlx_triton/_torchaudio.py); the check fails the set-up if that
# module cannot be loaded.
TORCHAUDIO := torchaudio==2.11.1
TORCHAUDIO_DIR := $(VENV)/share/rlx_triton/torchaudio

# what the tests need beyond the demo: one install per line, so another dependency is one more line
$(STAMP): $(DEMO_STAMP)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q --no-deps --upgrade --target "$(TORCHAUDIO_DIR)" "$(TORCHAUDIO)"
	$(PY) -c "from rlx_triton._torchaudio import kaldi_compliance; assert kaldi_compliance() is not None"
	sh tests/integrations/install_pyannote_pipeline.sh $(PY)   # pyannote.audio for the pipeline tests and bench
	touch $(STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m rlx_triton.demo

# The interpreter runs kernels on one core: tests spread over every core (pytest-xdist), a test
# module's tests stay on one worker so its module-scoped fixtures (compiled plans, wheels) build once.
# The slowest tests are listed at the end, so a growing suite shows where its time goes.
PYTEST_WORKERS ?= auto
PYTEST := TRITON_INTERPRET=1 $(PY) -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadscope --durations=15

# mypy (one process) runs beside the audit's compile workers; the target fails if either does
test: $(STAMP)
	$(PYTEST) tests
	$(PY) -m mypy rlx_triton > .mypy.out 2>&1 & mypy=$$!; \
	$(PY) -m rlx_triton audit --arch sm_80 --arch sm_90; audit=$$?; \
	wait $$mypy; typed=$$?; cat .mypy.out; rm -f .mypy.out; test $$audit -eq 0 && test $$typed -eq 0

test-fast: $(STAMP)
	$(PYTEST) -x tests -m "not slow"

# the configuration is [tool.mypy] in pyproject.toml
typecheck: $(STAMP)
	$(PY) -m mypy rlx_triton

audit: $(STAMP)
	$(PY) -m rlx_triton audit --arch sm_80 --arch sm_90

bench: $(STAMP)
	$(PY) bench/run.py --quick

clean:
	rm -rf $(VENV) build dist *.egg-info
