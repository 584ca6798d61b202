"""ONNX's backend node tests, as the onnx wheel generates them: each a one-op model, its inputs and
the outputs ONNX expects (`onnx.backend.test.case.node.collect_testcases`; the wheel ships the
generators, not the data files).  They are ONNX's own statement of what each op computes, and
the reference engine is checked against them (tests/dyndq/reference/test_reference_node_tests.py,
tests/dyndq/reference/test_reference_ops.py).

`node_cases()` generates them once per process and keeps them by name: every module of ONNX's
generators but the pools' (LEFT_OUT), about 5 s.  The pools' generators compute their expected
outputs with onnx.reference's own pool helpers, so agreeing with them is no evidence, and they take
16 of the 21 s all the generators take (measured on 2 shared cores).  (ONNX's own collector,
`collect_testcases`, imports every module, and filters by op only on its first call in a process.)"""
from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
from onnx import numpy_helper


LEFT_OUT = ("averagepool", "lppool", "maxpool")  # generator modules not imported (above)


@functools.lru_cache(maxsize=1)
def node_cases() -> dict:
    """{name: TestCase} of every node test this onnx generates but LEFT_OUT's (models, data sets,
    rtol, atol).  Each generator module adds its cases to the package's list when imported."""
    import importlib
    import pkgutil

    from onnx import ONNX_ML
    from onnx.backend.test.case import node as package

    with warnings.catch_warnings(), np.errstate(all="ignore"):  # (the generators divide by zero on purpose)
        warnings.simplefilter("ignore")
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            leaf = module.name.rsplit(".", 1)[-1]
            if leaf in LEFT_OUT or (not ONNX_ML and ".ai_onnx_ml" in module.name):
                continue
            importlib.import_module(module.name)
    return {c.name: c for c in package._NodeTestCases if c.kind == "node"}


def value(v):
    """A data set's value as an engine takes it: NumPy arrays (ml_dtypes for the types NumPy lacks),
    lists for sequences, None for an empty optional."""
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, onnx.SequenceProto):
        return numpy_helper.to_list(v)
    if isinstance(v, onnx.OptionalProto):
        return numpy_helper.to_optional(v)
    if isinstance(v, np.generic):
        return np.asarray(v)
    if isinstance(v, list):
        return [value(x) for x in v]
    return v


def feeds(case, data_set) -> dict:
    """The inputs of one data set, by the names of the case's graph inputs."""
    names = [i.name for i in case.model.graph.input]
    return dict(zip(names, (value(v) for v in data_set[0])))


def expected(data_set) -> list:
    return [value(v) for v in data_set[1]]


def assert_as_expected(got, want, rtol: float, atol: float, where: str = "") -> None:
    """As ONNX's backend runner compares (same dtype and shape; floats within rtol and atol, NaN where
    NaN; strings and other types equal), sequences element by element."""
    if isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), f"{where}: {got!r} is not {want!r}"
        for k, (g, w) in enumerate(zip(got, want)):
            assert_as_expected(g, w, rtol, atol, f"{where}[{k}]")
        return
    if want is None:
        assert got is None, f"{where}: {got!r}, expected none"
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{where}: shape {got.shape}, expected {want.shape}"
    if want.dtype == object:  # (strings: ONNX's runner compares the values, whatever NumPy type holds them)
        np.testing.assert_array_equal(got, want, err_msg=where)
        return
    assert got.dtype == want.dtype, f"{where}: dtype {got.dtype}, expected {want.dtype}"
    if want.dtype.name == "bfloat16":  # (ONNX's runner allows two bfloat16 ulps)
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=max(rtol, 2**-6), atol=atol,
                                   err_msg=where)
    elif want.dtype.kind == "V":  # (float8, float4, int4 ...: bit for bit, NaN where NaN)
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32), err_msg=where)
    elif want.dtype.kind == "f" or want.dtype.kind == "c":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=where, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want, err_msg=where)


def with_opset(model: onnx.ModelProto, version: int, **attributes) -> onnx.ModelProto:
    """A copy of a one-node case model at ai.onnx `version` (its IR version the oldest that opset
    needs), its node given `attributes` (None removes one)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for o in out.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = version
    out.ir_version = onnx.helper.find_min_ir_version_for(list(out.opset_import), ignore_unknown=True)
    (node,) = out.graph.node
    kept = [a for a in node.attribute if a.name not in attributes]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.extend(onnx.helper.make_attribute(k, v) for k, v in attributes.items() if v is not None)
    return out
