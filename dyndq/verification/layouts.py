"""The known wrong readings of a checkpoint tensor, each as the values a reader making that
mistake would have put in the model: a weight that is not its checkpoint tensor's values, but is
one of these bit for bit, is named `layout` with that kind (docs/verify.md).

- "rows-permuted": a GGUF Q or K weight of the llama family whose llama.cpp rotary row
  permutation was not undone.  The wrong values are what the GGUF reader itself gives with its
  undo off (`open_checkpoint(path, unpermute=False)`: the rows as stored), so the permutation is
  the reader's one, not a second copy of it.
- "packing-order": an AWQ module whose 4-bit words were read in plain nibble order (nibble i is
  column i of its 8) instead of AWQ's [0, 2, 4, 6, 1, 3, 5, 7].  Two readings: qweight alone read
  so (qzeros right), and qweight and qzeros both (a reader with one unpack for both).  Each is
  the format's own decode of the module with its words repacked so that AWQ's reading of them is
  the plain reading of the stored ones (the reader has no switch for a wrong order).
"""
from __future__ import annotations

import numpy as np

PERMUTED_NOTE = "rows un-permuted"  # (what GGUFCheckpoint's SourceTensor.note says of a Q/K it reordered)


class WrongLayouts:
    """A checkpoint's wrong readings, tensor by tensor, made when first asked for."""

    def __init__(self, checkpoint, tensors: dict):
        self.checkpoint = checkpoint
        self.tensors = tensors  # name -> SourceTensor
        self._stored = None  # (GGUF: the same file opened with its undo off)
        self._awq = None  # (safetensors: module name -> Listed, for its AWQ modules)

    def of(self, name: str) -> list[tuple[str, str, np.ndarray]]:
        """(kind, what the mistake was, float32 values in the checkpoint's [out, in] order) for each
        wrong reading tensor `name` has; [] where it has none."""
        t = self.tensors.get(name)
        if t is None:
            return []
        if self.checkpoint.format == "GGUF" and PERMUTED_NOTE in t.note:
            return [("rows-permuted", "its rows as the GGUF file stores them: llama.cpp's rotary permutation of Q/K "
                     "not undone", self._as_stored(name))]
        if self.checkpoint.format == "safetensors":
            return self._awq_plain(name)
        return []

    def _as_stored(self, name: str) -> np.ndarray:
        from dyndq.checkpoints import open_checkpoint

        if self._stored is None:
            stored = open_checkpoint(self.checkpoint.path, unpermute=False)
            self._stored = {t.name: t for t in stored.tensors()}
        with np.errstate(all="ignore"):
            return np.asarray(self._stored[name].values(), np.float32)

    def _awq_plain(self, name: str) -> list[tuple[str, str, np.ndarray]]:
        from dyndq.checkpoints.safetensors.files import awq_version, listed

        if self._awq is None:
            self._awq = {m.stand_in().weight_name: m for m in listed(self.checkpoint.path)  # (GEMV packs in plain
                         if m.format == "awq" and awq_version(m.config) == "gemm"}     # order: no such misreading)
        if name not in self._awq:
            return []
        module = self._awq[name].load()
        qweight, qzeros = module.tensors["qweight"], module.tensors["qzeros"]
        both = {**module.tensors, "qweight": _misread(qweight), "qzeros": _misread(qzeros)}
        weight_only = {**module.tensors, "qweight": _misread(qweight)}
        return [("packing-order", "its 4-bit words read in plain nibble order, not AWQ's [0, 2, 4, 6, 1, 3, 5, 7] "
                 "(qweight and qzeros)", _decoded(module, both)),
                ("packing-order", "its qweight's 4-bit words read in plain nibble order, not AWQ's "
                 "[0, 2, 4, 6, 1, 3, 5, 7] (qzeros read right)", _decoded(module, weight_only))]


def _misread(words: np.ndarray) -> np.ndarray:
    """AWQ words repacked so that AWQ's own reading of them gives what a plain-order reading of
    `words` gives: AWQ reads column j from nibble REVERSE[j], so nibble k takes the word's nibble
    ORDER[k].  (The format's own decode then computes the wrong reading, NaN scales and all, exactly.)"""
    from dyndq.checkpoints.safetensors.awq import ORDER, SHIFTS

    w = np.ascontiguousarray(words).astype("<u4")
    nibbles = (w[..., None] >> SHIFTS) & np.uint32(0xF)
    return np.bitwise_or.reduce(nibbles[..., ORDER] << SHIFTS, axis=-1).astype("<u4").view(np.int32)


def _decoded(module, tensors: dict) -> np.ndarray:
    """The format's own dequantization of `module` holding `tensors` ([out, in] float32), as the
    checkpoint reader computes a module's values (its nodes, run)."""
    from onnx import helper

    import dyndq
    from dyndq.checkpoints.safetensors import nodes
    from dyndq.checkpoints.safetensors.checkpoint import weight_shape
    from dyndq.checkpoints.safetensors.files import Module

    changed = Module(module.name, module.format, tensors, module.config)
    placed = nodes(changed)
    out = helper.make_tensor_value_info(placed.output, placed.dtype, list(weight_shape(changed)))
    graph = helper.make_graph(placed.nodes, "module", [], [out], initializer=placed.tensors)
    with np.errstate(all="ignore"):
        return np.asarray(dyndq.run(dyndq.make_model(graph, opset=placed.opset), {})[placed.output], np.float32)
