"""Our ops are registered with ONNX as soon as both dyndq and onnx are imported, in either order.

`import dyndq` must not import onnx: `dyndq.kernels` and `dyndq.shape_inference`
run with NumPy alone, and importing them runs `dyndq/__init__.py` first.  Yet
`import dyndq` followed by `onnx.checker.check_model(...)` must find our schemas.
So when onnx is already imported, we register at once; otherwise we register the
moment onnx's import finishes.  Python has no post-import hook of its own (PEP 369
was withdrawn), so this module writes the smallest one: a meta-path finder that
steps aside after wrapping onnx's loader once.
"""
from __future__ import annotations

import importlib.abc
import sys
import threading

_done = False
_lock = threading.RLock()


def ensure() -> None:
    """Attach every part and register every op version with ONNX (once; imports onnx)."""
    global _done
    with _lock:
        if _done:
            return
        _done = True
        # converters/ needs onnx; shape_inference/ and kernels/ attach on `import dyndq`
        from dyndq import converters  # noqa: F401
        from dyndq.schema import register_all

        register_all()


class _Loader(importlib.abc.Loader):
    """onnx's own loader, then `ensure()`."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        ensure()

    def __getattr__(self, name):  # resource readers and the like: onnx's loader answers
        return getattr(self._inner, name)


class _WhenOnnxImported(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "onnx":
            return None
        _remove_finder()  # once: the finders after us find onnx, we only wrap its loader
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


_finder = _WhenOnnxImported()


def _remove_finder() -> None:
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass


def install() -> None:
    """Register now if onnx is imported, else as soon as it is."""
    if "onnx" in sys.modules:
        ensure()
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
