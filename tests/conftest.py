import importlib.util
import os
import sys

_TESTS = os.path.dirname(os.path.abspath(__file__))

# tests/dyndq/ mirrors the dyndq/ folder; were tests/ on sys.path (as it is when
# pytest is started from inside tests/), it would shadow the real dyndq package
# as a namespace package. So tests/ never stays on sys.path...
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _TESTS]

# ...and the shared table of cases (tests/cases.py) is loaded by file, as `cases`.
if "cases" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("cases", os.path.join(_TESTS, "cases.py"))
    sys.modules["cases"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["cases"])
