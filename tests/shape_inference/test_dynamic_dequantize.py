"""The shape function on its own: no ONNX, just specs and attributes."""
import pytest

from dyndq.opdefs import DYNAMIC_DEQUANTIZE_1 as OP
from dyndq.opdefs import DYNAMIC_DEQUANTIZE_2
from dyndq.opdefs import TensorSpec, ValidationError


def problems_of(*args, **attrs):
    try:
        OP.shape_inference(*args, **attrs)
    except ValidationError as e:
        return e.problems
    return []


# (every row of the shared table, valid and invalid, through the shape function: tests/test_opcheck.py)


def test_symbolic_and_unknown_dims_pass_through():
    out = OP.shape_inference(TensorSpec("int8", ("N", None, 4)), TensorSpec("float32", (None,)),
                             TensorSpec("int8", ("C",)), qtype="per_channel", axis=1)
    assert out == TensorSpec("float32", ("N", None, 4))


def test_unknown_rank_passes_through_and_skips_axis_check():
    out = OP.shape_inference(TensorSpec("uint8", None), TensorSpec("float32", (3,)), None,
                             qtype="per_channel", axis=5)
    assert out == TensorSpec("float32", None)


def test_unknown_dtypes_are_not_judged():
    assert OP.shape_inference(TensorSpec(None, (2,)), TensorSpec(None, (1,))) == TensorSpec("float32", (2,))


def test_symbolic_channel_against_known_scales_is_not_judged():
    assert not problems_of(TensorSpec("int8", (2, "C")), TensorSpec("float32", (7,)), qtype="per_channel", axis=1)


def test_per_tensor_symbolic_scale_length_is_not_judged_but_rank_is():
    assert not problems_of(TensorSpec("int8", (2,)), TensorSpec("float32", ("K",)))
    [p] = problems_of(TensorSpec("int8", (2,)), TensorSpec("float32", ("K", 1)))
    assert p.argument == "scales" and "[1] or []" in p.allowed


@pytest.mark.parametrize("axis", ["1", 1.0, True, None])
def test_axis_must_be_an_integer(axis):
    [p] = problems_of(TensorSpec("int8", (2, 3)), TensorSpec("float32", (3,)), qtype="per_channel", axis=axis)
    assert p.argument == "axis" and p.allowed == "an integer"


@pytest.mark.parametrize("qtype", ["per_group", "PER_TENSOR", 1, b"per_tensor", None])
def test_qtype_must_be_known(qtype):
    [p] = problems_of(TensorSpec("int8", (2, 3)), TensorSpec("float32", (1,)), qtype=qtype)
    assert p.argument == "qtype"
    assert "'per_tensor'" in p.allowed and "'per_channel'" in p.allowed


def test_messages_say_what_was_found_and_what_is_allowed():
    [p] = problems_of(TensorSpec("int8", (2, 3)), TensorSpec("float32", (2,)), qtype="per_channel", axis=-1)
    assert p.found == "2 elements"
    assert "3 elements" in p.allowed and "src.shape[-1]" in p.allowed
    [p] = problems_of(TensorSpec("int8", (2, 3)), TensorSpec("float32", (3,)), qtype="per_channel", axis=2)
    assert p.found == "2" and p.allowed == "an integer in [-2, 1] for src of rank 2"
    [p] = problems_of(TensorSpec("int16", (2, 3)), TensorSpec("float32", (1,)))
    assert (p.found, p.allowed) == ("dtype int16", "T1 = int8 | uint8")


def test_every_problem_at_once():
    problems = problems_of(TensorSpec("bool", (2, 3)), TensorSpec("float64", (2,)), TensorSpec("uint16", (4,)),
                           qtype="per_channel", axis=1)
    assert [p.argument for p in problems] == ["src", "scales", "zps", "scales", "zps"]


# -- version 2 --------------------------------------------------------------------------------------

OP2 = DYNAMIC_DEQUANTIZE_2


def test_version_2_dst_has_scales_dtype_and_unknown_dims_pass():
    out = OP2.shape_inference(TensorSpec("uint4", ("N", 256)), TensorSpec("bfloat16", ("N", None)),
                              TensorSpec("uint8", (None, 2)), qtype="per_group", group_shape=[1, 128])
    assert out == TensorSpec("bfloat16", ("N", 256))
    # scales' dtype unknown: so is dst's
    assert OP2.shape_inference(TensorSpec("int4", (4,)), TensorSpec(None, (1,))) == TensorSpec(None, (4,))


def test_version_2_names_every_problem_at_once():
    with pytest.raises(ValidationError) as e:
        OP2.shape_inference(TensorSpec("int4", (8, 64)), TensorSpec("float16", (2, 3)), TensorSpec("uint8", (2,)),
                            qtype="per_group", group_shape=[4, 30])
    found = {(p.argument, p.found) for p in e.value.problems}
    assert ("group_shape", "group_shape[1] = 30") in found
    assert any(arg == "zps" for arg, _ in found)


@pytest.mark.parametrize("group_shape", [2.0, "1,32", [[1, 32]], [1, True], [1, 2.5]])
def test_group_shape_of_the_wrong_kind(group_shape):
    with pytest.raises(ValidationError) as e:
        OP2.shape_inference(TensorSpec("int4", (4, 64)), TensorSpec("float16", (4, 2)), None,
                            qtype="per_group", group_shape=group_shape)
    assert [p.argument for p in e.value.problems] == ["group_shape"]
    assert "list of ints" in e.value.problems[0].allowed


def test_version_1_knows_no_group_shape():
    with pytest.raises(TypeError):
        OP.shape_inference(TensorSpec("int8", (4,)), TensorSpec("float32", (1,)), group_shape=[4])


def test_per_group_with_src_of_unknown_shape_infers_what_it_can():
    """A src whose shape nothing tells (a value no node makes, in `check`) is no crash: the
    output's dtype is known, its shape not."""
    from dyndq import DYNAMIC_DEQUANTIZE_2, TensorSpec

    out = DYNAMIC_DEQUANTIZE_2.shape_inference(TensorSpec("int4", None), TensorSpec("float32", (2, 3)), None,
                                               qtype="per_group", group_shape=(2, 1))
    assert (out.dtype, out.shape) == ("float32", None)
