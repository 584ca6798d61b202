# `make demo` and `make test` work on a fresh clone with only python3 and make:
# each creates .venv when missing and installs the package with its test extra.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-big bench install test-oldest clean

$(STAMP): pyproject.toml setup.py kernels/_native.c $(wildcard kernels/_native_*.h)
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "dyndq needs Python 3.11 or newer; try: make PYTHON=python3.11 ..."; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dyndq demo

test: $(STAMP)
	$(PY) -m pytest -q

# the tests that need more than 2 GiB of memory (models over 2 GiB; about 15 GiB at peak)
test-big: $(STAMP)
	$(PY) -m pytest -q -m big

bench: $(STAMP)
	$(PY) benchmarks/bench_kernel.py

# The whole suite on the oldest releases pyproject.toml allows (each ">=X.Y" read as
# "==X.Y.*"), in a venv of its own: keeps those lower bounds true.
OLDEST := .venv-oldest
test-oldest:
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(PYTHON) -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
		print('\n'.join(d.replace('>=', '==') + '.*' for d in p['dependencies'] + p['optional-dependencies']['test']))" \
		> $(OLDEST)/oldest.txt
	$(OLDEST)/bin/python -m pip install --quiet -r $(OLDEST)/oldest.txt
	$(OLDEST)/bin/python -m pip install --quiet --no-deps -e .
	$(OLDEST)/bin/python -m pytest -q

clean:
	rm -rf $(VENV) $(OLDEST) build *.egg-info dyndq-demo
