"""Quantized checkpoints in: the parts of the weight import (`dyndq import-weights`, not written yet).

A checkpoint's quantized tensors are read one at a time and each becomes ONNX tensors and nodes
(our DynamicDequantize and standard ops) that compute exactly the checkpoint's own dequantization,
bit for bit.  One subpackage per kind of checkpoint file: `gguf/` (llama.cpp's files),
`safetensors/` (GPTQ, AWQ and compressed-tensors checkpoints); `writer.py`, what both write their
nodes with.  docs/import.md says what exists.
"""
