"""oneDNN Graph JSON in and out: the public face of the interop.

- `load(path_or_dict) -> (onnx.ModelProto, ImportReport)`: a oneDNN graph (benchdnn's
  cases, oneDNN's graph dump) as an ONNX model holding our op and standard ONNX.
- `dump(model) -> dict` (and `save_json`, with the weights' arrays beside it in
  `weights_folder(path)`): the other way, a model as a oneDNN graph.
- `example_inputs(model, seed)`: feeds a real run could see, one per graph input.
- `unpack_int4` / `pack_int4`: oneDNN's int4 memory (two per byte by physical
  offset, even offset in the low nibble) to and from ml_dtypes arrays.
- `KINDS`: the one table of handlers, oneDNN op kind -> `Handler`.

The modules: reader (the JSON and its structure), handler (what a kind's handler holds,
and the table), kinds (the table filled by the families: quantization, matmul, normalization,
elementwise, layout), emitter (what mappings write with), importer, writer, metadata (what load
leaves in a model, read back with checks), examples, int4.
"""
from dyndq.onednn.examples import example_inputs
from dyndq.onednn.importer import ImportReport, load
from dyndq.onednn.int4 import pack_int4, unpack_int4
from dyndq.onednn.kinds import KINDS
from dyndq.onednn.writer import dump, save_json, weights_folder

__all__ = ["ImportReport", "KINDS", "dump", "example_inputs", "load", "pack_int4", "save_json", "unpack_int4",
           "weights_folder"]
