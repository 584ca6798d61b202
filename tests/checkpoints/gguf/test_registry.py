"""The registry of GGUF block types: a type registered from a test (inside `scope()`) is what
`nodes` writes for tensors of its name, and is gone after; a name registered twice is refused."""
from __future__ import annotations

import numpy as np
import pytest

import dyndq
from dyndq.checkpoints import gguf as ours


def test_a_type_registered_in_a_scope_writes_its_tensors_and_is_gone_after():
    tensor = ours.GGUFTensor("w", "TOY4", (2, 8), np.arange(2 * 12, dtype=np.uint8).reshape(2, 12))
    with ours.scope():
        @ours.block_type("TOY4", block=4, size=6, composition="four int8 codes under a float16 scale")
        def toy(w, blocks):  # float16 d, then four int8 codes
            return w.dequantize(w.tensor(blocks[..., 2:].view(np.int8), "codes"), w.half(blocks, 0, "scales"),
                                group_shape=(1, 1, 4), hint="product")

        placed = ours.nodes(tensor)
        assert "TOY4" in ours.names() and placed.form == "GGUF TOY4: four int8 codes under a float16 scale"
        from onnx import TensorProto, helper

        out = helper.make_tensor_value_info(placed.output, TensorProto.FLOAT, [2, 8])
        model = dyndq.make_model(helper.make_graph(placed.nodes, "g", [], [out], initializer=placed.tensors))
        got = dyndq.run(model, {})[placed.output]
        blocks = tensor.data.reshape(2, 2, 6)
        want = blocks[..., 2:].view(np.int8).astype(np.float32) * blocks[..., :2].copy().view(np.float16).astype(np.float32)
        assert got.tobytes() == want.reshape(2, 8).tobytes()
    assert "TOY4" not in ours.names()
    with pytest.raises(ours.UnsupportedType, match="TOY4"):
        ours.nodes(tensor)


def test_a_name_registered_twice_is_refused():
    with ours.scope(), pytest.raises(ValueError, match="'Q4_0' registered already"):
        ours.block_type("Q4_0", block=32, size=18, composition="again")(lambda w, blocks: "")
