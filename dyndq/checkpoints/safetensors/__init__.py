"""Safetensors checkpoints in (GPTQ, AWQ, compressed-tensors): each module, streamed from the
files, as exact ONNX nodes.

    from dyndq.checkpoints import safetensors as st
    for module in st.read("checkpoint/"):             # a .safetensors file or a folder with config.json
        placed = st.nodes(module)                     # tensors + nodes computing `<module>.weight`

`read` (files.py) groups each quantized module's tensors by the `safetensors` package's
`safe_open` (NumPy framework: no torch; `pip install 'dyndq[import]'`), one module at a time;
`nodes` writes one through the shared Writer (dyndq/checkpoints/writer.py), by its format's module:
gptq.py, awq.py, compressed.py (pack-quantized, nvfp4-pack-quantized); packing.py holds the int32
unpacking and the composition they share.  The value (`Written.output`, of type `Written.dtype`:
the format's own, float16 for float16 scales) is the weight in torch's orientation [out, in],
exactly the format's own dequantization; each module says why.  docs/import.md has the table.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from dyndq.checkpoints.safetensors import awq, compressed, gptq
from dyndq.checkpoints.safetensors.files import Module, read
from dyndq.checkpoints.writer import Writer, Written
from dyndq.plumbing.names import NameScope

WRITERS = {"gptq": gptq.write, "awq": awq.write, "pack-quantized": compressed.pack_quantized,
           "nvfp4-pack-quantized": compressed.nvfp4}


def nodes(module: Module, names_in_use: NameScope | None = None, *, name: str | None = None) -> Written:
    """The ONNX tensors and nodes whose output holds exactly the format's own dequantization of
    `module`'s weight ([out, in], of the type it computes in), named after `name` (the module's
    weight name by default); a dense tensor: the tensor itself."""
    w = Writer(name or module.weight_name, names_in_use)
    if module.format == "dense":
        array = np.ascontiguousarray(module.tensors[""])
        value = w.op("Identity", [w.tensor(array, "tensor")], "tensor_out")
        return w.finish(value, array.shape, f"the {array.dtype} tensor itself",
                        helper.np_dtype_to_tensor_dtype(array.dtype))
    value, shape, form = WRITERS[module.format](w, module)
    last = next(n for n in w.nodes if n.output[0] == value)
    while last.op_type == "Gather":  # (GPTQ act-order's rows put back: the type of what it copies)
        last = next(n for n in w.nodes if n.output[0] == last.input[0])
    dtype = next((a.i for a in last.attribute if a.name in ("to", "output_dtype")), TensorProto.FLOAT)
    return w.finish(value, shape, form, dtype)


__all__ = ["Module", "Written", "awq", "compressed", "gptq", "nodes", "read"]
