"""The helpers tests share, imported as `cases` (tests/ is on pytest's pythonpath)."""
from .table import *  # noqa: F401,F403
from .table import _NOT_FEEDABLE, _onnxruntime_holds  # noqa: F401
