"""GGUF (llama.cpp's files) in: each tensor, streamed from the file, as exact ONNX nodes.

    from dyndq.checkpoints import gguf
    for tensor in gguf.read("model.gguf"):            # one at a time, memory-mapped (needs `gguf`)
        placed = gguf.nodes(tensor)                   # tensors + nodes computing its float32 values

`read` wraps `gguf.GGUFReader` (the llama.cpp project's own reader: `pip install 'dyndq[import]'`);
`nodes` needs nothing but dyndq (but the lattice types' grids: gguf's own).  One module per family of block types, each registering its types
(registry.py, a sibling of the quantization formats' registry: it says why): floats.py (F32, F16,
BF16), legacy.py (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), kquants.py (Q2_K ... Q6_K), iq4.py (IQ4_NL, IQ4_XS),
ternary.py (TQ1_0, TQ2_0), fp4.py (MXFP4, NVFP4), lattice.py (IQ1_*, IQ2_*, IQ3_*).  Every type's
nodes compute exactly the float32 bits of `gguf.quants.dequantize`; each module says why.
docs/import.md has the table.
"""
from dyndq.checkpoints.gguf.registry import BlockType, block_type, get, names, scope
from dyndq.checkpoints.gguf.tensors import GGUFTensor, UnsupportedType, nodes, read
from dyndq.checkpoints.gguf import floats, legacy, kquants, iq4, ternary, fp4, lattice  # noqa: E402,F401,I001  (each family registers its types, in GGUF's order)

__all__ = ["BlockType", "GGUFTensor", "UnsupportedType", "block_type", "floats", "fp4", "get", "iq4", "kquants", "lattice",
           "legacy", "names", "nodes", "read", "scope", "ternary"]
