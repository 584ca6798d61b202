import importlib.util
import os
import sys

# The shared table of cases (tests/cases.py) is importable as `cases`. It is loaded
# by file rather than by putting tests/ on sys.path: there, tests/dyndq/ would
# shadow the real dyndq package as a namespace package.
if "cases" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("cases", os.path.join(os.path.dirname(__file__), "cases.py"))
    sys.modules["cases"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["cases"])
