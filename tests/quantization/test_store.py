"""quantize goes through the walker: its rule is applied by converters/walker.py, which reads each
weight and writes each tensor of the new model through the quantizer's store (`Tensors`), once
each and in the order the model holds them (what lets the store write a data file as it goes)."""
from __future__ import annotations

import numpy as np
from onnx import numpy_helper as nh

from dyndq.quantization.options import QuantizeOptions
from dyndq.quantization.quantizer import Tensors, quantize_model

from quantize_models import exported_attention, mlp


class Recording(Tensors):
    def __init__(self):
        super().__init__()
        self.calls, self.keeping = [], False

    def array(self, tensor):
        self.calls.append(("read", tensor.name))
        return super().array(tensor)

    def put(self, tensor):
        if not self.keeping:  # (Tensors.keep puts the tensor kept)
            self.calls.append(("put", tensor.name))
        return super().put(tensor)

    def keep(self, tensor):
        self.calls.append(("keep", tensor.name))
        self.keeping = True
        try:
            super().keep(tensor)
        finally:
            self.keeping = False


def test_each_weight_is_read_once_and_each_tensor_stored_once_in_the_models_order():
    model = mlp(k=256, n=64, vocab=32)
    model.graph.initializer.insert(1, nh.from_array(np.ones(3, np.float32), "bias"))  # (a constant no rule takes)
    before = model.SerializeToString()
    store = Recording()
    out, report = quantize_model(model, QuantizeOptions.checked(model), store)
    assert [c for c in store.calls if c[0] == "read"] == [("read", "E"), ("read", "W1"), ("read", "W2")]
    stored = [name for kind, name in store.calls if kind != "read"]
    assert stored == [t.name for t in out.graph.initializer]
    assert ("keep", "bias") in store.calls and not {"E", "W1", "W2"} & set(stored)
    assert all(not t.external_data for t in out.graph.initializer)  # (no placeholder left)
    assert model.SerializeToString() == before  # (the model given is not changed)
    assert [layer.name for layer in report.layers] == ["E", "W1", "W2"]


def test_constant_node_weights_are_read_through_the_store_and_become_initializers():
    model = exported_attention()
    store = Recording()
    out, report = quantize_model(model, QuantizeOptions.checked(model), store)
    assert [name for kind, name in store.calls if kind == "read"] == ["E", "Wq", "Wk", "Wv", "Wo"]
    assert [name for kind, name in store.calls if kind != "read"] == [t.name for t in out.graph.initializer]
    assert not any(n.op_type in ("Constant", "Identity") for n in out.graph.node)


def test_in_memory_a_kept_table_is_copied_in_once_the_walk_is_done():
    """A float table the rule leaves alone (a Gather's, MatMul alone quantized) stays a placeholder
    while the weights are quantized (the calibration's passes run then) and is filled after: the
    new model does not hold a second copy of it during the walk."""

    class Watching(Tensors):
        def structure(self, model):
            self.out = super().structure(model)
            return self.out

        def array(self, tensor):
            if tensor.name == "W1":  # (after E was kept)
                table = next(t for t in self.out.graph.initializer if t.name == "E")
                self.seen = (len(table.external_data), len(table.raw_data) + len(table.float_data))
            return super().array(tensor)

    model = mlp(k=256, n=64, vocab=32)
    store = Watching()
    out, report = quantize_model(model, QuantizeOptions.checked(model, ops=("MatMul",)), store)
    assert [layer.name for layer in report.layers] == ["W1"]
    assert store.seen == (1, 0)
    table = next(t for t in out.graph.initializer if t.name == "E")
    given = next(t for t in model.graph.initializer if t.name == "E")
    assert table == given and not table.external_data
