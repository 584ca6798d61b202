"""A safetensors checkpoint (GPTQ, AWQ, compressed-tensors) opened for import: its modules as the
import's source tensors (source.py), each named by its weight (`<module>.weight`), in torch's
orientation [out, in] as the formats' nodes give it.

Names: a module's weight is the float model's initializer of the same name (torch and optimum
keep the module names), else `--names` or by shape and closeness: safetensors checkpoints have no
name map of their own.  The modules are listed from the files' headers when the checkpoint is
opened (files.listed), and a module's bytes read each time its nodes or values are asked for
and let go after: the import holds one module at a time.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dyndq.checkpoints.source import Checkpoint, MissingExtra, SourceTensor, opener

SUFFIX = ".safetensors"


@opener("safetensors (a .safetensors file, or a folder of them with config.json)")
def open_safetensors(path: str):
    p = Path(path)
    if not (p.suffix == SUFFIX and p.is_file() or p.is_dir() and any(p.glob(f"*{SUFFIX}"))):
        return None
    return SafetensorsCheckpoint(p)


def weight_shape(module) -> tuple[int, ...]:
    """The shape of the module's weight as its nodes give it ([out, in]; a dense tensor's own),
    from the tensors' shapes alone (the formats' writers check them when the nodes are made)."""
    t = module.tensors
    if module.format == "dense":
        return tuple(t[""].shape)
    if module.format == "gptq":
        bits = int(module.config.get("bits", 4))
        n_in = len(t["g_idx"]) if "g_idx" in t else t["qweight"].shape[0] * 32 // bits
        return (t["qweight"].shape[1], n_in)
    if module.format == "awq":
        from dyndq.checkpoints.safetensors.awq import weight_shape as awq_shape

        return awq_shape(module)
    if module.format == "nvfp4-pack-quantized":
        return (t["weight_packed"].shape[0], t["weight_packed"].shape[1] * 2)
    return tuple(int(n) for n in np.asarray(t["weight_shape"]).reshape(-1))  # pack-quantized


class SafetensorsCheckpoint(Checkpoint):
    format = "safetensors"

    def __init__(self, path: str | os.PathLike):
        try:
            import safetensors  # noqa: F401
        except ImportError as e:  # (an optional extra: dyndq itself runs without it)
            raise MissingExtra("reading safetensors checkpoints needs the `safetensors` package: "
                               "pip install 'dyndq[import]'") from e
        from dyndq.checkpoints.safetensors.files import listed

        self.path = os.fspath(path)
        self._modules = listed(self.path)

    def tensors(self) -> list[SourceTensor]:
        return [_source(m) for m in self._modules]


def _source(listed) -> SourceTensor:
    from dyndq.checkpoints.safetensors import nodes

    module = listed.stand_in()  # (shapes and types: no data)
    kind = (f"dense {module.tensors[''].dtype}" if module.format == "dense"
            else f"{module.format} {module.config.get('bits', '')}".strip())
    return SourceTensor(module.weight_name, weight_shape(module), kind, module.nbytes,
                        lambda names, name: nodes(listed.load(), names, name=name), lambda: _values(listed.load()))


def _values(module) -> np.ndarray:
    """The module's weight as its nodes compute it (the reference engine with our kernel: the
    format's own dequantization, bit for bit), as float32 (for the by-shape matching)."""
    import dyndq
    from dyndq.checkpoints.safetensors import nodes
    from onnx import helper

    placed = nodes(module)
    out = helper.make_tensor_value_info(placed.output, placed.dtype, list(weight_shape(module)))
    graph = helper.make_graph(placed.nodes, "module", [], [out], initializer=placed.tensors)
    with np.errstate(all="ignore"):
        return np.asarray(dyndq.run(dyndq.make_model(graph, opset=placed.opset), {})[placed.output], np.float32)
