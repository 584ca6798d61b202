"""Quantized checkpoints in: the weight import (`dyndq.import_weights`, `dyndq import-weights`).

A checkpoint's quantized tensors are read one at a time and each becomes ONNX tensors and nodes
(our DynamicDequantize and standard ops) that compute exactly the checkpoint's own dequantization,
bit for bit.  One subpackage per kind of checkpoint file: `gguf/` (llama.cpp's files),
`safetensors/` (GPTQ, AWQ and compressed-tensors checkpoints), each registering its opener
(source.py: the seam a format plugs into); `writer.py`, what both write their nodes with;
matching.py finds which tensor is which weight of the model, placing.py puts the decodes in,
importer.py is the whole import (docs/import.md says what exists).
"""
from dyndq.checkpoints.source import Checkpoint, MissingExtra, SourceTensor, open_checkpoint, opener
from dyndq.checkpoints.gguf import checkpoint as _gguf_checkpoint  # noqa: F401  (registers GGUF's opener)
from dyndq.checkpoints.safetensors import checkpoint as _safetensors_checkpoint  # noqa: F401  (registers its opener)
from dyndq.checkpoints.importer import EMITS, ImportReport, import_file, import_weights

__all__ = ["Checkpoint", "EMITS", "ImportReport", "MissingExtra", "SourceTensor", "import_file", "import_weights", "open_checkpoint",
           "opener"]
