"""oneDNN Graph JSON in and out: the public face of the interop.

- `load(path_or_dict) -> (onnx.ModelProto, ImportReport)`: a oneDNN graph (benchdnn's
  cases, oneDNN's graph dump) as an ONNX model holding our op and standard ONNX.
- `dump(model) -> dict` (and `save_json`): the other way, a model as a oneDNN graph.
- `example_inputs(model, seed)`: feeds a real run could see, one per graph input.
- `unpack_int4` / `pack_int4`: oneDNN's int4 memory (two per byte by physical
  offset, even offset in the low nibble) to and from ml_dtypes arrays.
- `KINDS`: the one table of mappings, oneDNN op kind -> the function that writes it.

One module per concern beside this one (flat, so that the package's wheel holds
them without a new package entry): onednn_reader (the JSON and its structure),
onednn_kinds (the mappings), onednn_emitter (what mappings write with),
onednn_importer, onednn_writer, onednn_int4, onednn_examples.
"""
from dyndq.onednn_examples import example_inputs
from dyndq.onednn_importer import ImportReport, load
from dyndq.onednn_int4 import pack_int4, unpack_int4
from dyndq.onednn_kinds import KINDS
from dyndq.onednn_writer import dump, save_json

__all__ = ["ImportReport", "KINDS", "dump", "example_inputs", "load", "pack_int4", "save_json", "unpack_int4"]
