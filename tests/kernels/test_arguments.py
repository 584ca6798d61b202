"""The kernel's arguments: every bad one named, all at once, in one dyndq.ValidationError; the
kernel's signature as the registry states it.  Validation happens before a path is chosen
(kernels/dynamic_dequantize.py), so these run once, not on every path of the kernel."""
from __future__ import annotations

import inspect

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dyndq
from cases import oracle, same_bits
from dyndq import DYNAMIC_DEQUANTIZE_1, DYNAMIC_DEQUANTIZE_2, DYNAMIC_DEQUANTIZE_3, TensorSpec, ValidationError

# version 1's kernel judged by version 1's rules (version 2's is dyndq.dynamic_dequantize)
dynamic_dequantize = DYNAMIC_DEQUANTIZE_1.kernel

f32 = np.float32
u8 = np.uint8
i8 = np.int8


def dt(name):
    return np.dtype(name)


# (every invalid row of the shared table through the kernel, with and without out: tests/test_opcheck.py)


def test_error_is_dyndq_validation_error_and_value_error():
    with pytest.raises(dyndq.ValidationError) as e:
        dynamic_dequantize(np.zeros(3, np.int16), np.ones(1, f32))
    assert isinstance(e.value, ValueError)
    assert "src" in str(e.value) and "int16" in str(e.value)


# -- the signature agreed by the registry -------------------------------------------------------


@pytest.mark.parametrize("op", [DYNAMIC_DEQUANTIZE_1, DYNAMIC_DEQUANTIZE_2, DYNAMIC_DEQUANTIZE_3], ids=repr)
def test_kernel_is_attached_and_signature_agrees(op):
    assert DYNAMIC_DEQUANTIZE_3.kernel is dyndq.dynamic_dequantize
    ours = list(inspect.signature(op.kernel).parameters.values())
    theirs = list(op.signature().parameters.values())
    assert ours[: len(theirs)] == theirs
    extra = ours[len(theirs):]
    assert [p.name for p in extra] == ["out", "threads"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is None for p in extra)


def test_bad_out():
    src = np.zeros((2, 3), i8)
    scales = np.ones(1, f32)
    for out, what in [
        (np.empty((2, 3), np.float64), "float64"),
        (np.empty((3, 2), f32), "shape"),
        (np.empty((2, 3), np.float16), "float16"),
        ([[0.0] * 3] * 2, "list"),
    ]:
        with pytest.raises(ValidationError) as e:
            dynamic_dequantize(src, scales, out=out)
        assert [p.argument for p in e.value.problems] == ["out"], what
        assert what in str(e.value)
    ro = np.empty((2, 3), f32)
    ro.flags.writeable = False
    with pytest.raises(ValidationError, match="read-only"):
        dynamic_dequantize(src, scales, out=ro)


def test_out_overlapping_an_input_is_refused():
    buf = np.zeros(64, u8)
    src = buf[:16]
    out = buf.view(f32)[:16]
    with pytest.raises(ValidationError) as e:
        dynamic_dequantize(src, np.ones(1, f32), out=out)
    assert {p.argument for p in e.value.problems} == {"out"} and "src" in str(e.value)
    scales = np.ones(16, f32)
    with pytest.raises(ValidationError, match="scales"):
        dynamic_dequantize(np.zeros((1, 16), u8), scales[:1], out=scales.reshape(1, 16))
    # a neighbour in the same buffer that does not overlap is fine
    buf = np.zeros(32 + 64, u8)
    src = buf[:16]
    out = buf[32:].view(f32)
    assert dynamic_dequantize(src, np.ones(1, f32), out=out) is out


# -- lists, scalars, and other non-arrays ---------------------------------------------------------


@pytest.mark.parametrize("arg", ["src", "scales", "zps"])
@pytest.mark.parametrize("value", [[1, 2], 3, 0.5, (1,), "x"])
def test_lists_and_python_scalars_are_refused(arg, value):
    args = {"src": np.zeros(2, u8), "scales": np.ones(1, f32), "zps": np.zeros(1, u8)}
    args[arg] = value
    with pytest.raises(ValidationError) as e:
        dynamic_dequantize(args["src"], args["scales"], args["zps"])
    assert [p.argument for p in e.value.problems] == [arg]
    assert "numpy.asarray" in str(e.value)


def test_masked_arrays_are_refused():
    with pytest.raises(ValidationError, match="masked"):
        dynamic_dequantize(np.ma.masked_array(np.zeros(2, u8)), np.ones(1, f32))


def test_numpy_scalars_are_zero_d_arrays():
    got = dynamic_dequantize(np.uint8(30), np.float32(0.5), np.uint8(10))
    assert got.shape == () and got.dtype == f32 and float(got) == 10.0
    with pytest.raises(ValidationError, match="int64"):
        dynamic_dequantize(np.int64(3), np.float32(0.5))


def test_every_problem_at_once():
    with pytest.raises(ValidationError) as e:
        dynamic_dequantize([1], np.ones(2, np.float64), np.zeros(1, np.int64), qtype="per_tensor", out=np.zeros(1, np.int8))
    assert {p.argument for p in e.value.problems} == {"src", "scales", "zps", "out"}


@pytest.mark.parametrize("axis", [1.0, "1", None, True, np.float32(1)])
def test_axis_must_be_an_integer(axis):
    with pytest.raises(ValidationError) as e:
        dynamic_dequantize(np.zeros((2, 3), i8), np.ones(3, f32), qtype="per_channel", axis=axis)
    assert [p.argument for p in e.value.problems] == ["axis"]


def test_numpy_integer_axis_accepted():
    src = np.arange(6, dtype=i8).reshape(2, 3)
    got = dynamic_dequantize(src, np.arange(3, dtype=f32), qtype="per_channel", axis=np.int64(-1))
    assert same_bits(got, oracle(src, np.arange(3, dtype=f32), None, "per_channel", 1))


@pytest.mark.parametrize("qtype", ["per_group", "PER_TENSOR", None, 1, b"per_tensor"])
def test_unknown_qtype(qtype):
    with pytest.raises(ValidationError) as e:
        dynamic_dequantize(np.zeros(2, i8), np.ones(1, f32), qtype=qtype)
    assert [p.argument for p in e.value.problems] == ["qtype"]


@pytest.mark.parametrize("threads", [0, -1, 1.5, "2", True])
def test_bad_threads(threads):
    with pytest.raises(ValidationError) as e:
        dynamic_dequantize(np.zeros(2, i8), np.ones(1, f32), threads=threads)
    assert [p.argument for p in e.value.problems] == ["threads"]


@settings(max_examples=150, deadline=None)
@given(
    src=hnp.arrays(st.sampled_from(["int8", "uint8"]), hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=9)),
    data=st.data(),
)
def test_property_shape_function_agrees_on_random_attributes(src, data):
    """Random (valid or not) parameter shapes: the kernel raises exactly when the shape function does."""
    qtype = data.draw(st.sampled_from(["per_tensor", "per_channel"]))
    axis = data.draw(st.integers(-src.ndim - 1, src.ndim))
    scales = np.ones(data.draw(st.sampled_from([(), (1,), (2,), (3,), (1, 1)])) or (), f32)
    if qtype == "per_channel" and data.draw(st.booleans()) and -src.ndim <= axis < src.ndim:
        scales = np.ones(src.shape[axis], f32)
    zps = data.draw(st.sampled_from([None, (), (1,), scales.shape, (4,)]))
    zps = None if zps is None else np.zeros(zps, u8)
    try:
        spec = DYNAMIC_DEQUANTIZE_1.shape_inference(
            TensorSpec.of(src), TensorSpec.of(scales), None if zps is None else TensorSpec.of(zps), qtype=qtype, axis=axis
        )
    except ValidationError as e:
        with pytest.raises(ValidationError) as k:
            dynamic_dequantize(src, scales, zps, qtype=qtype, axis=axis)
        assert [p.argument for p in k.value.problems] == [p.argument for p in e.problems]
    else:
        got = dynamic_dequantize(src, scales, zps, qtype=qtype, axis=axis)
        assert spec == TensorSpec.of(got)
        assert same_bits(got, oracle(src, scales, zps, qtype, axis))



# -- version 2's arguments (int4/uint4, float16/bfloat16, per_group)


@pytest.mark.parametrize("group_shape", [1.5, "1,32", [[1, 32]], [1.0, 32.0], [True, 32], [1, None]])
def test_group_shape_of_the_wrong_kind_is_named(group_shape):
    src = np.zeros((2, 64), dt("int4"))
    with pytest.raises(ValidationError) as e:
        dyndq.dynamic_dequantize(src, np.ones((2, 2), np.float16), qtype="per_group", group_shape=group_shape)
    assert [p.argument for p in e.value.problems] == ["group_shape"]
    assert "list of ints" in str(e.value)


@pytest.mark.parametrize("version, bad", [(2, "float8_e4m3fn"), (2, "int2"), (2, "float64"), (2, "int16"),
                                          (3, "float64"), (3, "int64"), (3, "bool")])
def test_dtypes_outside_t1_t2_t3_are_named_with_every_other_problem(version, bad):
    b = dt(bad)
    src = np.zeros((2, 64), b)
    kernel = {2: DYNAMIC_DEQUANTIZE_2, 3: DYNAMIC_DEQUANTIZE_3}[version].kernel
    with pytest.raises(ValidationError) as e:
        kernel(src, np.ones((2, 2), b), np.zeros((2, 2), b), qtype="per_group", group_shape="x",
               out=np.zeros((2, 64), np.float64), threads=0)
    named = [p.argument for p in e.value.problems]
    assert set(named) == {"src", "scales", "zps", "group_shape", "out", "threads"}, str(e.value)
    text = str(e.value)
    assert bad in text and "int4" in text and "bfloat16" in text
    assert "float32 | float16 | bfloat16" in text  # out: what scales' dtype could have been


def test_out_of_another_t2_is_refused():
    with pytest.raises(ValidationError) as e:
        dyndq.dynamic_dequantize(np.zeros(4, dt("uint4")), np.ones(1, ml_dtypes.bfloat16), out=np.zeros(4, np.float16))
    assert [p.argument for p in e.value.problems] == ["out"] and "bfloat16" in str(e.value)


def test_per_group_shape_problems_at_once():
    with pytest.raises(ValidationError) as e:
        dyndq.dynamic_dequantize(np.zeros((4, 6), dt("int4")), np.ones((2, 2), np.float16), np.zeros((2, 3), np.uint8),
                           qtype="per_group", group_shape=[2, 4])
    named = {p.argument for p in e.value.problems}
    assert "zps" in named and ("group_shape" in named or "scales" in named), str(e.value)
