"""oneDNN Graph JSON in and out.

- `load(path_or_dict) -> (onnx.ModelProto, ImportReport)`: a oneDNN graph (benchdnn's
  cases, oneDNN's graph dump) as an ONNX model holding our op and standard ONNX.
- `dump(model) -> dict`: the other way, a model as a oneDNN graph JSON object.
- `example_inputs(model, seed)`: feeds a real run could see, one per graph input.
- `unpack_int4` / `pack_int4`: oneDNN's int4 memory (two per byte by physical
  offset, even offset in the low nibble) to and from ml_dtypes arrays.

Modules: reader (JSON and its structure), kinds (one mapping per op kind, in one
table), emitter (what mappings write with), importer, writer, int4, examples.
"""
from dyndq.onednn.importer import ImportReport, load

__all__ = ["ImportReport", "load", "dump", "save_json", "example_inputs", "pack_int4", "unpack_int4", "KINDS"]


def __getattr__(name):
    if name in ("dump", "save_json"):
        from dyndq.onednn import writer
        return getattr(writer, name)
    if name == "example_inputs":
        from dyndq.onednn.examples import example_inputs
        return example_inputs
    if name in ("pack_int4", "unpack_int4"):
        from dyndq.onednn import int4
        return getattr(int4, name)
    if name == "KINDS":
        from dyndq.onednn.kinds import KINDS
        return KINDS
    raise AttributeError(f"module 'dyndq.onednn' has no attribute {name!r}")
