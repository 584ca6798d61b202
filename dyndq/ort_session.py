"""ONNX Runtime, the one runner of it: `OrtSession(exported, level=...)`, fed and read one way.

ONNX Runtime's Python API refuses int4/uint4 and bfloat16 NumPy feeds and cannot return such
outputs; `OrtBoundary` passes them through exact conversions (each type as the dtype table's
`onnxruntime` column says).  A model over 2 GiB cannot be serialized for ONNX Runtime: its big
initializers are handed over as arrays, fed as the graph inputs its light view makes of them.
`dyndq.run(engine="onnxruntime")`, quantize's evaluation and size budget, `dyndq.runtime_parity`
and the tests run ONNX Runtime through `OrtSession`; the check of a written file makes its
session through `user_session`, at ONNX Runtime's own defaults.  Every ONNX Runtime session of
the package is made here (`_session`).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx

from dyndq.opdefs import dtypes

# ONNX Runtime's graph optimization levels, by the names the house uses (the CLI's --level too).
LEVELS = ("off", "basic", "extended", "all")


class OrtSession:
    """An ONNX Runtime CPU session on an exported (standard ONNX) model: `run(names, feeds)`.

    `level` is the graph optimization level; `optimized_model_path`, when given, is where ONNX
    Runtime saves the graph it optimized (`boundary.added` names the nodes the boundary added to
    it, which are not the model's).  `disabled_optimizers`: graph transformers and rewrite rules
    ONNX Runtime leaves out, by name (it accepts unknown names silently); `config`: session
    config entries (`SessionOptions.add_session_config_entry`).  Logging is off: ONNX Runtime's
    errors come back as exceptions.

    `weights`: arrays fed with every run for graph inputs of `exported` that stand for weights
    held outside it (a model's big initializers made inputs, as `light_view` makes them), so that
    a caller holding them once passes them without a copy.  `arena=False`: ONNX Runtime's CPU
    arena off, so each intermediate value's memory goes back when it is freed (with the arena,
    a run's largest values, a dequantized weight each, stay held until the session goes).

    `path`: the file `exported` was read from (it may then be read without its external data):
    ONNX Runtime reads the model there, its external data too, as a user's session does, so its
    weights stay the initializers the file holds (a MatMulNBits' B among them), unless the
    boundary must add a Cast at an input or output, when the model is handed over as above.

    `threads`: ONNX Runtime's intra-op threads (None: its default, one per core)."""

    def __init__(self, exported: onnx.ModelProto, *, level: str = "basic", optimized_model_path: str | None = None,
                 disabled_optimizers: Sequence[str] = (), config: Mapping[str, str] | None = None,
                 weights: Mapping[str, np.ndarray] | None = None, arena: bool = True, path: str | None = None,
                 threads: int | None = None):
        import onnxruntime as ort

        from dyndq.plumbing.light import big_initializers, light_view

        if level not in LEVELS:
            raise ValueError(f"unknown level {level!r}; choose one of: {', '.join(LEVELS)}")
        settings = dict(level=level, optimized_model_path=optimized_model_path, config=config, arena=arena,
                        threads=threads, disabled_optimizers=disabled_optimizers)
        # (the boundary is made on the light view, so that a big int4 or bfloat16 initializer,
        # fed as an input there, passes through it as any input does)
        self.boundary = OrtBoundary(light_view(exported))
        if path is not None and not self.boundary.added:
            self._big = dict(weights or {})
            self.session = _session(path, **settings)
        else:
            if path is not None:  # (a Cast added at the boundary: the model handed over whole)
                from dyndq.model_files import load_model

                exported = load_model(path)
                self.boundary = OrtBoundary(light_view(exported))
            self._big = {**(weights or {}),
                         **{t.name: onnx.numpy_helper.to_array(t) for t in big_initializers(exported)}}
            self.session = _session(self.boundary.model.SerializeToString(), **settings)
        self.output_names = [o.name for o in exported.graph.output]
        self._run_options = ort.RunOptions()
        self._run_options.log_severity_level = 4

    def run(self, names: Sequence[str] | None, feeds: Mapping[str, object]) -> list:
        """The values `names` (the graph's own names and dtypes; None: the graph's outputs) on
        `feeds`, checked feeds: see `dyndq.runner.check_feeds`."""
        # (not np.ascontiguousarray: it turns a rank-0 array into rank 1)
        arrays = {k: _c_contiguous(v) for k, v in feeds.items()}
        names = self.output_names if names is None else list(names)
        return self.boundary.run(self.session, names, {**arrays, **self._big}, self._run_options)


INSTALL = "pip install onnxruntime"  # (a dependency of dyndq: installed with it)


def version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def installed() -> bool:
    """ONNX Runtime is a dependency of dyndq: always here."""
    return True


def user_session(source):
    """ONNX Runtime's CPU session of a model file (or a ModelProto) at ONNX Runtime's own default
    settings, nothing added, as a user's `InferenceSession(path)` makes it: what the check of a
    written file loads (its error is ONNX Runtime's own, raised)."""
    if isinstance(source, onnx.ModelProto):
        source = source.SerializeToString()
    return _session(source, level=None)


def _session(source, *, level: str | None, optimized_model_path: str | None = None,
             disabled_optimizers: Sequence[str] = (), config: Mapping[str, str] | None = None,
             arena: bool | None = None, threads: int | None = None):
    """The one place an ONNX Runtime session is made: a CPU session of `source` (a path or a
    serialized model); `level` None, `arena` None and `threads` None leave ONNX Runtime's defaults.
    Logging is off: its errors come back as exceptions."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: its (coloured) log lines would reach stderr
    if level is not None:
        if level not in LEVELS:
            raise ValueError(f"unknown level {level!r}; choose one of: {', '.join(LEVELS)}")
        levels = ort.GraphOptimizationLevel
        options.graph_optimization_level = dict(zip(LEVELS, (levels.ORT_DISABLE_ALL, levels.ORT_ENABLE_BASIC,
                                                             levels.ORT_ENABLE_EXTENDED, levels.ORT_ENABLE_ALL)))[level]
    if optimized_model_path is not None:
        options.optimized_model_filepath = optimized_model_path
    if arena is not None:
        options.enable_cpu_mem_arena = arena
    if threads is not None:
        options.intra_op_num_threads = threads
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(disabled_optimizers))


def missing_kernel(error: BaseException) -> str | None:
    """The op (and version) ONNX Runtime has no kernel for, when `error` is its NOT_IMPLEMENTED
    refusal of a session ("Could not find an implementation for DequantizeLinear(28) node ..."):
    a valid model it cannot run, as opposed to one it finds invalid; else None."""
    import re

    if type(error).__name__ != "NotImplemented":
        return None
    found = re.search(r"implementation for (\S+\(\d+\))", str(error))
    return found.group(1) if found else "an op of the model"


class OrtBoundary:
    """What ONNX Runtime's Python API cannot pass, passed through exact conversions.

    ORT's Python API refuses int4/uint4 and bfloat16 NumPy feeds and cannot return
    bfloat16 or int4 outputs (checked on 1.27 to 1.32).  So, on a copy of the
    exported model (the exported model itself is left as export wrote it):

    - an int4/uint4 graph input becomes an int8/uint8 input followed by a Cast to
      int4/uint4 that produces the original name (exact: every int4 value is an
      int8 value); the feed is converted with NumPy, also exactly;
    - a bfloat16 feed goes in as an OrtValue of ONNX type BFLOAT16 over the
      array's 16-bit pattern (the bits as they are, NaN payloads included), and a
      float8 (float8e8m0 too) feed likewise over its 8-bit pattern;
    - an int2/uint2 feed goes in as an OrtValue of that type made by ONNX Runtime
      (`ortvalue_from_shape_and_type`) and filled with the bytes ONNX itself packs
      for the array (`numpy_helper.from_array`: four codes a byte, low bits first),
      the layout ONNX Runtime holds them in (measured on 1.32: a Cast to float32
      gives every code's value);
    - an int4/uint4 graph output is Cast to int8/uint8 and a bfloat16 one to
      float32 (ORT's bfloat16 -> float32 Cast shifts the bits: exact, NaN
      payloads included), and converted back here: int4 by value, bfloat16 by
      taking the upper 16 bits (no rounding involved); a float8 output is Cast to
      float32 and back by value (exact: every float8 value is a float32 one).

    Returned arrays have the graph's own dtypes, as the reference engine returns.  Which types
    take which way is the dtype table's `onnxruntime` column (ORT_BITS, ORT_WIDE, ORT_PACKED).
    """

    def __init__(self, exported: onnx.ModelProto):
        from dyndq.plumbing.names import NameScope

        graph = exported.graph
        initializers = {t.name for t in graph.initializer}
        int4_in = [vi for vi in graph.input
                   if _carried(vi) == dtypes.ORT_WIDE and vi.name not in initializers]
        self.bits_in = {vi.name: _elem(vi) for vi in graph.input if _carried(vi) in (dtypes.ORT_BITS, dtypes.ORT_PACKED)}
        narrow_out = [vi for vi in graph.output if _carried(vi) in (dtypes.ORT_WIDE, dtypes.ORT_BITS)]
        self.model = exported
        self.renamed_in: dict[str, tuple[str, np.dtype]] = {}  # graph input -> (fed name, NumPy dtype fed)
        self.renamed_out: dict[str, tuple[str, int]] = {}  # graph output -> (name ORT returns, ONNX type it had)
        self.added: set[str] = set()  # the names of the Cast nodes added here (not the model's own)
        if not int4_in and not narrow_out:
            return
        model = onnx.ModelProto()
        model.CopyFrom(exported)
        from dyndq.plumbing.names import all_names

        names = NameScope(all_names(model))
        casts = []
        for vi in model.graph.input:
            if vi.name in {v.name for v in int4_in}:
                narrow, wide = _elem(vi), _wide(_elem(vi))
                fed = names.fresh(f"{vi.name}/{onnx.TensorProto.DataType.Name(wide).lower()}")
                casts.append(onnx.helper.make_node("Cast", [fed], [vi.name], to=narrow,
                                                   name=names.fresh(f"{vi.name}/Cast")))
                self.renamed_in[vi.name] = (fed, dtypes.by_onnx(wide).numpy)
                vi.name = fed
                vi.type.tensor_type.elem_type = wide
        for vi in model.graph.output:
            narrow = _elem(vi)
            if _carried(vi) not in (dtypes.ORT_WIDE, dtypes.ORT_BITS):
                continue
            wide = _wide(narrow) if _carried(vi) == dtypes.ORT_WIDE else onnx.TensorProto.FLOAT
            out = names.fresh(f"{vi.name}/{onnx.TensorProto.DataType.Name(wide).lower()}")
            model.graph.node.append(onnx.helper.make_node("Cast", [vi.name], [out], to=wide,
                                                          name=names.fresh(f"{vi.name}/Cast")))
            self.renamed_out[vi.name] = (out, narrow)
            vi.name = out
            vi.type.tensor_type.elem_type = wide
        self.added = {n.name for n in casts} | {n.name for n in model.graph.node[len(exported.graph.node):]}
        nodes = casts + list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        self.model = model

    def feeds(self, feeds: Mapping[str, object]) -> dict:
        import onnxruntime as ort

        out = {}
        for name, value in feeds.items():
            if name in self.renamed_in:
                fed, dtype = self.renamed_in[name]
                out[fed] = np.asarray(value).astype(dtype)
            elif (name in self.bits_in and isinstance(value, np.ndarray)
                  and value.dtype.name == dtypes.by_onnx(self.bits_in[name]).name):
                row = dtypes.by_onnx(self.bits_in[name])
                if row.onnxruntime == dtypes.ORT_PACKED:
                    out[name] = _packed_ortvalue(value, row.onnx)
                else:  # (its bit patterns, as unsigned integers of its width)
                    out[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                        np.ascontiguousarray(value).view(f"uint{row.bits}"), row.onnx)
            else:
                out[name] = value
        return out

    def run(self, session, output_names: list[str], feeds: Mapping[str, object], run_options=None) -> list:
        asked = [self.renamed_out.get(n, (n, None))[0] for n in output_names]
        results = session.run(asked, self.feeds(feeds), run_options)
        back = []
        for name, value in zip(output_names, results):
            if name in self.renamed_out:
                narrow = self.renamed_out[name][1]
                value = np.asarray(value)
                if narrow == onnx.TensorProto.BFLOAT16:
                    value = (value.view(np.uint32) >> 16).astype(np.uint16).view(dtypes.by_name("bfloat16").numpy)
                else:  # int8/uint8 back to int4/uint4, float32 back to float8, by value
                    value = value.astype(dtypes.by_onnx(narrow).numpy)
            back.append(value)
        return back


def _carried(vi: onnx.ValueInfoProto) -> str | None:
    """How ONNX Runtime's Python API carries a tensor of this value's type (dtypes.ORT_*)."""
    try:
        return dtypes.by_onnx(_elem(vi)).onnxruntime
    except KeyError:  # (no tensor type, or one the table lacks: as given)
        return dtypes.ORT_NUMPY


def _wide(narrow: int) -> int:
    """The 8-bit integer type an int4/uint4 passes the boundary as (every value of it is one)."""
    return dtypes.by_name("uint8" if dtypes.by_onnx(narrow).name.startswith("u") else "int8").onnx


def _packed_ortvalue(value: np.ndarray, elem: int):
    """An OrtValue of a sub-byte ONNX type holding `value`: ONNX Runtime allocates it (it owns its
    memory, so nothing here must outlive it) and it is filled with the bytes ONNX packs for the
    array."""
    import ctypes

    import onnxruntime as ort

    raw = onnx.numpy_helper.from_array(np.ascontiguousarray(value)).raw_data
    ortvalue = ort.OrtValue.ortvalue_from_shape_and_type(list(value.shape), elem)
    if len(raw) != ortvalue.tensor_size_in_bytes():  # (a layout ONNX Runtime changed)
        raise RuntimeError(f"ONNX Runtime holds a {list(value.shape)} tensor of "
                           f"{onnx.TensorProto.DataType.Name(elem)} in {ortvalue.tensor_size_in_bytes()} bytes; "
                           f"ONNX packs it in {len(raw)}")
    if raw:
        ctypes.memmove(ortvalue.data_ptr(), raw, len(raw))
    return ortvalue


def _elem(vi: onnx.ValueInfoProto) -> int:
    return vi.type.tensor_type.elem_type if vi.type.WhichOneof("value") == "tensor_type" else 0


def _c_contiguous(value):
    if isinstance(value, np.ndarray) and not value.flags.c_contiguous:
        return value.copy(order="C")
    return value
