"""dyndq.plumbing.opsets: reading and editing opset imports (ai.onnx written "" or "ai.onnx"), and
resolving a node of ours by the imports of its scope, as ONNX resolves schemas."""
from onnx import helper

import dyndq
from dyndq.plumbing.opsets import (ai_onnx_version, drop_opset, import_at_least, import_if_absent, op_version,
                                   scope_opsets, set_opset)


def imports(**versions):
    return [helper.make_opsetid("" if d == "default" else d.replace("_", "."), v) for d, v in versions.items()]


def test_a_node_of_ours_resolves_to_the_largest_version_not_above_its_scopes_import():
    node = dyndq.make_node(["w", "s"], ["y"])
    assert op_version(node, {dyndq.DOMAIN: 2}) is dyndq.DYNAMIC_DEQUANTIZE_2
    assert op_version(node, {dyndq.DOMAIN: 9}) is dyndq.DYNAMIC_DEQUANTIZE_3
    # no import of our domain in the scope: nothing (never another scope's import)
    assert op_version(node, {"": 21}) is None
    assert op_version(helper.make_node("Relu", ["x"], ["y"]), {"": 21, dyndq.DOMAIN: 1}) is None


def test_reading_imports():
    found = imports(default=21, com_microsoft=1)
    assert scope_opsets(found) == {"": 21, "com.microsoft": 1}
    assert ai_onnx_version(found) == 21
    assert ai_onnx_version(imports(ai_onnx=18)) == 18
    assert ai_onnx_version(imports(com_microsoft=1)) is None


def test_import_at_least_keeps_a_newer_import_and_adds_a_missing_one():
    found = imports(default=21)
    import_at_least(found, "", 18)
    import_at_least(found, "com.microsoft", 1)
    assert scope_opsets(found) == {"": 21, "com.microsoft": 1}
    import_at_least(found, "", 23)
    assert scope_opsets(found) == {"": 23, "com.microsoft": 1}


def test_import_if_absent_never_changes_a_version_there():
    found = imports(default=21)
    import_if_absent(found, "", 25)
    import_if_absent(found, "local", 1)
    assert scope_opsets(found) == {"": 21, "local": 1}


def test_set_opset_sets_exactly_and_knows_ai_onnx_by_either_name():
    found = imports(ai_onnx=21)
    set_opset(found, "", 13)
    assert scope_opsets(found) == {"ai.onnx": 13}
    set_opset(found, "local", 2)
    assert scope_opsets(found) == {"ai.onnx": 13, "local": 2}


def test_drop_opset_says_whether_it_was_there():
    found = imports(default=21, local=1)
    assert drop_opset(found, "local") is True
    assert drop_opset(found, "local") is False
    assert scope_opsets(found) == {"": 21}
