"""The registry: keys, resolution as ONNX does it, and every op version complete."""
import inspect

import pytest

import dyndq
from dyndq.opdefs import (DOMAIN, DYNAMIC_DEQUANTIZE_1, MissingPartError, OpVersion, all_versions, qualname,
                          register, resolve, versions_of)
from dyndq.opdefs import registry
from dyndq.opdefs.registry import PARTS


def test_every_version_is_registered_under_its_key():
    assert DYNAMIC_DEQUANTIZE_1.key == (DOMAIN, "DynamicDequantize", 1)
    assert DYNAMIC_DEQUANTIZE_1 in all_versions()
    assert versions_of(DOMAIN, "DynamicDequantize") == [1, 2, 3]


def test_domain_is_reverse_dns_and_exposed():
    assert dyndq.DOMAIN == DOMAIN
    assert "." in DOMAIN and DOMAIN == DOMAIN.lower()


@pytest.mark.parametrize("opset, expected", [(0, None), (1, 1), (2, 2), (3, 3), (7, 3)])
def test_resolve_picks_largest_version_not_above_the_import(opset, expected):
    op = resolve(DOMAIN, "DynamicDequantize", opset)
    assert (op.since_version if op else None) == expected


def _toy(v, **kw):
    return OpVersion("Toy", "test.registry", v, "toy", (), (), (), (), **kw)


def test_resolve_with_several_versions():
    """A made-up op with versions 1 and 3 in a private domain resolves like ONNX."""
    with registry.scope():
        v1, v3 = register(_toy(1)), register(_toy(3))
        assert resolve("test.registry", "Toy", 2) is v1
        assert resolve("test.registry", "Toy", 3) is v3
        assert resolve("test.registry", "Toy", 9) is v3
        assert resolve("test.registry", "Toy", 0) is None
        assert resolve("test.registry", "Other", 3) is None
    assert versions_of("test.registry", "Toy") == []  # the scope took them away again


@pytest.mark.parametrize("part", PARTS)
def test_a_missing_part_is_a_named_error_not_a_key_error(part):
    with registry.scope():
        toy = register(_toy(2))
        with pytest.raises(MissingPartError) as e:
            getattr(toy, part)
    message = str(e.value)
    assert "test.registry::Toy-2" in message and f"has no {part}" in message
    assert f"TOY_2.def_{part}" in message and "/toy.py" in message


def test_qualname_is_built_in_one_place():
    assert DYNAMIC_DEQUANTIZE_1.qualname == qualname(DOMAIN, "DynamicDequantize") == "org.dyndq::DynamicDequantize"
    assert DYNAMIC_DEQUANTIZE_1.handle_name == "DYNAMIC_DEQUANTIZE_1"
    assert DYNAMIC_DEQUANTIZE_1.base_name == "dynamic_dequantize"


def test_registering_the_same_handle_twice_is_harmless_but_a_different_one_is_refused():
    assert register(DYNAMIC_DEQUANTIZE_1) is DYNAMIC_DEQUANTIZE_1
    clone = OpVersion(**{f: getattr(DYNAMIC_DEQUANTIZE_1, f) for f in
                         ("name", "domain", "since_version", "doc", "inputs", "outputs", "attributes", "type_constraints")})
    with pytest.raises(ValueError, match="already registered"):
        register(clone)


def test_definition_matches_design():
    op = DYNAMIC_DEQUANTIZE_1
    assert [(p.name, p.type_var, p.optional) for p in op.inputs] == [
        ("src", "T1", False), ("scales", "T2", False), ("zps", "T3", True)]
    assert [(p.name, p.type_var) for p in op.outputs] == [("dst", "T2")]
    assert {c.name: c.dtypes for c in op.type_constraints} == {
        "T1": ("int8", "uint8"), "T2": ("float32",), "T3": ("int8", "uint8", "int32")}
    assert op.defaults() == {"qtype": "per_tensor", "axis": 1}
    assert op.attribute("qtype").allowed == ("per_tensor", "per_channel")


# Parts that take something else first: a lowering takes its context; a lifting takes a
# standard node and a spec lookup, not the op's inputs, so it has its own signature.
_LEADING = {"lowering": 1}
_OWN_SIGNATURE = {"lifting": ["node", "spec"]}


def _signature_problems(op: OpVersion, part: str, fn) -> list[str]:
    """The handle's signature must come first, exactly; extra keyword-only parameters may follow."""
    got = list(inspect.signature(fn).parameters.values())
    if part in _OWN_SIGNATURE:
        names = [p.name for p in got]
        return [] if names == _OWN_SIGNATURE[part] else [f"{part} {fn.__name__}{inspect.signature(fn)}: want {_OWN_SIGNATURE[part]}"]
    want = list(op.signature().parameters.values())
    got = got[_LEADING.get(part, 0):]
    head, extra = got[: len(want)], got[len(want):]
    problems = []
    if [(p.name, p.kind, p.default) for p in head] != [(p.name, p.kind, p.default) for p in want]:
        problems.append(f"{part} {fn.__module__}.{fn.__name__}{inspect.signature(fn)} does not start with {op.signature()}")
    problems += [f"{part}: extra parameter {p.name!r} must be keyword-only with a default" for p in extra
                 if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.default is inspect.Parameter.empty]
    return problems


@pytest.mark.parametrize("op", [o for o in all_versions() if o.domain == DOMAIN], ids=repr)
def test_every_op_version_has_every_part_with_agreeing_signatures(op):
    """No xfail: an op version registered without a part fails here, naming what is missing."""
    problems = [f"{op!r}: no {part}" for part in op.missing_parts()]
    problems += [p for part, fn in op.parts.items() for p in _signature_problems(op, part, fn)]
    # the same base name in every aspect folder (TVM's legalize folder does the same); a version
    # whose part outgrows its module has one of its own beside it, `<base name>_<version>`
    names = {op.base_name, f"{op.base_name}_{op.since_version}"}
    problems += [f"{part} lives in {fn.__module__}, not in a module named {' or '.join(sorted(names))}"
                 for part, fn in op.parts.items() if fn.__module__.rsplit(".", 1)[-1] not in names]
    assert not problems, problems


def test_the_parts():
    assert PARTS == ("shape_inference", "kernel", "lowering", "lowering_needs", "lifting")
