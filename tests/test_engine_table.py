"""The engine table of docs/low-bit.md is this test's output: for each code type (and each form
the engines differ on), the form every export target gets, each run on its engine (OpenVINO
where it is installed: `make test-openvino`) with the oracle's bits.

OpenVINO's CPU plugin folds constants with arithmetic of its own: a cell says where that gives other
bits than the kernel's, and the OpenVINO test checks the cell says true. The table in the page
must be what this computes; `DYNDQ_WRITE_TABLE=1 pytest
tests/test_engine_table.py` writes it there."""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from onnx import helper, numpy_helper

from cases import oracle_3, same_bits
from engines import run_openvino

import dyndq
from dyndq.converters.engines import ENGINES, engine
from dyndq.exporter import export_with_report
from dyndq.runner import ENGINES as RUN
from dyndq.opdefs import FLOAT_CODES_3, INTEGER_CODES_3, dtypes

PAGE = Path(__file__).resolve().parents[1] / "docs" / "low-bit.md"
BEGIN, END = "<!-- engine table: tests/test_engine_table.py -->", "<!-- end of the engine table -->"
E8M0 = "float8_e8m0fnu"
GROUPS = {"qtype": "per_group", "group_shape": [1, 16]}
# (row label, code type, scales' dtype, attributes, src's shape)
ROWS = [(f"{code} codes", code, "float32", GROUPS, (2, 64)) for code in INTEGER_CODES_3 + FLOAT_CODES_3] + [
    ("float4e2m1 codes, float8e8m0 scales (MXFP4)", "float4_e2m1fn", E8M0, {**GROUPS, "output_dtype": 1}, (2, 64)),
    ("int8 codes, float8e8m0 scales, float16 output", "int8", E8M0, {**GROUPS, "output_dtype": 10}, (2, 64)),
    ("uint4 codes, bfloat16 output", "uint4", "float32", {**GROUPS, "output_dtype": 16}, (2, 64)),
    ("int4 codes blocked on a rank-1 src", "int4", "float32", {"qtype": "per_group", "group_shape": [16]}, (64,)),
    ("float8_e4m3fn codes, zero points of -0", "float8_e4m3fn", "float32", GROUPS, (2, 64)),
    ("float8_e4m3fn codes, NaN scales", "float8_e4m3fn", "float32", GROUPS, (2, 64)),
]
# rows whose arrays hold what they are about: each float code's zero (+0, -0) and NaNs, beside zero
# points of -0 (a -0 code minus -0 is +0), or beside NaN scales of either sign and other payloads
# (a NaN code times a NaN scale is the code's NaN)
SPECIAL = {"float8_e4m3fn codes, zero points of -0": "minus zero points", "float8_e4m3fn codes, NaN scales": "nan scales"}
# each column's head, from the engine table: "onnx (onnx.reference)", "onnxruntime (ONNX Runtime CPU)", ...
TITLES = {t: f"{t} (onnx.reference)" if e.runner == "reference" else f"{t} ({e.title} CPU)" for t, e in ENGINES.items()}


def _arrays(code, scale_dtype, attrs, shape, special=None):
    rng = np.random.default_rng(0)
    row = dtypes.by_name(code)
    if row.bits <= 8:
        x = rng.integers(0, 1 << row.bits, shape).astype(np.uint8).view(row.numpy)
    else:
        lo, hi = dtypes.integer_range(code)
        x = rng.integers(lo, hi, shape, endpoint=True).astype(row.numpy)
    groups = attrs["group_shape"]
    s_shape = tuple(d // g for d, g in zip(shape, groups))
    if scale_dtype == E8M0:
        s = rng.integers(110, 140, s_shape).astype(np.uint8).view(dtypes.by_name(E8M0).numpy)
    else:
        s = (rng.standard_normal(s_shape) * 0.02).astype(scale_dtype)
    z = None
    if special:
        x.view(np.uint8).reshape(-1)[:4] = [0x80, 0x00, 0x7F, 0xFF]  # -0, +0 and two NaNs, in the first group
        if special == "nan scales":
            nans = np.array([0xFFC00001, 0x7FC12345], np.uint32).view(np.float32)
            s.reshape(-1)[::2] = np.resize(nans, s.reshape(-1)[::2].size)
        else:
            z = np.full(s_shape, -0.0, np.float32).astype(row.numpy)
    return x, s, z


def _model(x, s, attrs, z=None):
    out = attrs.get("output_dtype") or dtypes.of(s.dtype).onnx
    arrays = [("x", x), ("s", s)] + ([("z", z)] if z is not None else [])
    node = dyndq.make_node([n for n, _ in arrays], ["y"], name="dq", version=3, **attrs)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", out, list(x.shape))],
                              initializer=[numpy_helper.from_array(a, n) for n, a in arrays])
    return dyndq.make_model(graph)


def _deviation(target, code, attrs) -> str:
    """The measured deviation of the target's engine a row meets ("" for none)."""
    if target != "openvino":
        return ""
    if attrs.get("output_dtype") == 16:
        return "not exact: its constant folding truncates float32 to bfloat16"
    if code == "float8_e5m2":
        return "not exact: NaN codes keep their payload"
    return ""


def _row(label, code, scale_dtype, attrs, shape):
    x, s, z = _arrays(code, scale_dtype, attrs, shape, SPECIAL.get(label))
    want = oracle_3(x, s, z, "per_group", 1, attrs["group_shape"], attrs.get("output_dtype"))
    return _model(x, s, attrs, z), want


def engine_table() -> str:
    """The table: what export writes for each target, and what the engine is said to do with it
    (the reference engine and ONNX Runtime checked here against the oracle; OpenVINO's column by
    `test_openvino_runs_its_column_as_the_table_says`)."""
    lines = ["| codes (scales per group of 16) | " + " | ".join(TITLES[t] for t in ENGINES) + " |",
             "|---|" + "---|" * len(ENGINES)]
    for label, code, scale_dtype, attrs, shape in ROWS:
        model, want = _row(label, code, scale_dtype, attrs, shape)
        cells = []
        for target in ENGINES:
            exported, report = export_with_report(model, target=target)
            if engine(target).runner in RUN:  # (an engine with deviations: checked by its own test)
                got = dyndq.run(exported, {}, engine=engine(target).runner)["y"]
                assert same_bits(got, want), (label, target, report.lowered[0].form)
            notes = [] if engine(target).holds(code) else ["constants only"]
            notes += [_deviation(target, code, attrs)] if _deviation(target, code, attrs) else ["exact"]
            cells.append(f"{report.lowered[0].form} (opset {report.opset}); " + "; ".join(notes))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def test_the_engine_table_in_the_docs_is_what_each_engine_runs():
    table = engine_table()
    text = PAGE.read_text()
    block = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    assert block, f"{PAGE} holds no engine table between {BEGIN!r} and {END!r}"
    if os.environ.get("DYNDQ_WRITE_TABLE") == "1":
        PAGE.write_text(text[:block.start(1)] + table + text[block.end(1):])
        pytest.skip(f"wrote the table into {PAGE}")
    assert block.group(1) == table, f"the engine table changed; DYNDQ_WRITE_TABLE=1 writes it:\n{table}"


@pytest.mark.openvino
def test_openvino_runs_its_column_as_the_table_says():
    """Each row's openvino export on OpenVINO: the oracle's bits, or, where the table names a
    deviation, not them (the table says what OpenVINO really does)."""
    for label, code, scale_dtype, attrs, shape in ROWS:
        model, want = _row(label, code, scale_dtype, attrs, shape)
        [got] = run_openvino(dyndq.export(model, target="openvino"), {})
        assert same_bits(got, want) != bool(_deviation("openvino", code, attrs)), label
