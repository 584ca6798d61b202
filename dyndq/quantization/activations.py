"""The inputs of the quantized MatMul and Gemm nodes, collected from ONNX Runtime and summed per layer.

A data-aware method (gptq.py; AWQ and scale estimation after it) needs, for each weight W of
a node computing X @ W, statistics of X on calibration inputs: X^T X (K x K, float64, the
Hessian of the layer's squared output error is 2 X^T X) and per input channel the mean and
largest |x|.  `layer_inputs` finds which value is X for each weight of the plan; `collect`
runs the model on ONNX Runtime once per sample, with those values exposed as graph outputs of
a copy made for the run (the model passed in is never changed), and adds each sample's rows
to the statistics as they come: what it holds is the statistics (K x K per distinct input) and
the model, never every sample's activations.  An input of shape [..., K] counts as its rows of
K (batch and sequence flattened); Gemm's A with transA=1 ([K, M]) is transposed first.

A weight whose reader is not a MatMul or Gemm of the main graph (a Gather's table, a node
inside a Loop's body or a function: ONNX Runtime exposes only the main graph's values), or a
MatMul's B of rank other than 2, has no input here: `layer_inputs` says why, for its caller to
say (gptq.py rounds it by rtn and the report names it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from dyndq.opdefs import Problem, ValidationError

MAIN = "main"  # the main graph's scope path (plumbing.walk.scopes)


@dataclass(frozen=True)
class LayerInput:
    """One value a quantized node multiplies its weight by: X of X @ W (Gemm: A, `transposed`
    when transA=1, so that its rows of K are its columns)."""

    value: str
    k: int
    transposed: bool = False
    dtype: str = "float32"  # (A's type is B's: MatMul and Gemm take one type)


@dataclass
class ActivationStats:
    """Sums over every row x (length K) of one LayerInput on the calibration samples."""

    k: int
    gram: np.ndarray | None  # float64 [K, K]: sum of x^T x (None when not asked for)
    abs_sum: np.ndarray  # float64 [K]: sum of |x| per input channel
    abs_max: np.ndarray  # float64 [K]: the largest |x| per input channel
    rows: int = 0

    @classmethod
    def empty(cls, k: int, gram: bool = True) -> ActivationStats:
        return cls(k, np.zeros((k, k)) if gram else None, np.zeros(k), np.zeros(k))

    def add(self, rows: np.ndarray) -> None:
        """Rows [M, K] (any float dtype) added to the sums, in float64."""
        x = rows.astype(np.float64)
        if self.gram is not None:
            self.gram += x.T @ x
        magnitude = np.abs(x)
        self.abs_sum += magnitude.sum(axis=0)
        if len(x):
            np.maximum(self.abs_max, magnitude.max(axis=0), out=self.abs_max)
        self.rows += len(x)

    @staticmethod
    def bytes_for(k: int, gram: bool = True) -> int:
        """The bytes the statistics of one input of K channels hold (float64: X^T X and two sums)."""
        return 8 * (k * k if gram else 0) + 8 * 2 * k

    @property
    def mean_abs(self) -> np.ndarray:
        """The mean |x| per input channel (AWQ's activation magnitude): [K]."""
        return self.abs_sum / max(self.rows, 1)


class ActivationError(ValidationError):
    """The calibration run gave an activation a data-aware method cannot use (NaN or infinity)."""


def layer_inputs(model: onnx.ModelProto, targets) -> tuple[dict, dict]:
    """({(graph, weight name): [LayerInput of each of its readers, distinct]}, {(graph, weight name):
    why it has none}) for the plan's targets (plan.Target)."""
    nodes = list(model.graph.node)
    found, missing = {}, {}
    for t in targets:
        key = (t.graph, t.name)
        if len(t.dims) != 2:
            missing[key] = f"a weight of rank {len(t.dims)} (the inputs are collected for 2-D weights only)"
            continue
        k = t.dims[t.axis]
        inputs = []
        for u in t.uses:
            if u.op not in ("MatMul", "Gemm"):
                missing[key] = f"read by {u.op} {u.node!r}, which multiplies no activation by it"
                break
            if u.graph != MAIN:
                missing[key] = f"read by {u.node!r} in {u.graph!r}, not the main graph (only its values can be collected)"
                break
            node = nodes[u.index]
            transposed = u.op == "Gemm" and any(a.name == "transA" and a.i for a in node.attribute)
            one = LayerInput(node.input[0], k, transposed, t.dtype)
            if one not in inputs:
                inputs.append(one)
        else:
            found[key] = inputs
    return found, missing


def collect(model: onnx.ModelProto, inputs, feeds: list[dict], *, loaded=None, gram: bool = True,
            progress=None, mapped: MappedWeights | None = None) -> dict[LayerInput, ActivationStats]:
    """The statistics of each of `inputs` (LayerInputs) over the samples `feeds` (checked feed
    dicts), the model run on ONNX Runtime (`loaded`: as model_files.read_model(..., load_data=False)
    read it, its weights read from its external data for the run) with only those inputs exposed:
    one pass over the samples (calibration.py runs several, a group of inputs each, within a memory
    bound).  `gram`: also sum X^T X.  `mapped`: the big weights fed mapped from its file (MappedWeights)."""
    from dyndq.quantization.evaluate import OnOrt

    inputs = list(dict.fromkeys(inputs))
    stats = {i: ActivationStats.empty(i.k, gram) for i in inputs}
    fed = {vi.name for vi in model.graph.input}
    wanted = {i.value: i.dtype for i in inputs if i.value not in fed}
    try:
        # (the float model on ONNX Runtime as the evaluation runs it, only these values given: evaluate.OnOrt)
        run = OnOrt(model, loaded, outputs=wanted, weights=mapped and mapped.arrays()) if wanted else None
    except Exception as e:  # noqa: BLE001 - a model ONNX Runtime cannot load (a bfloat16 MatMul): said, not a traceback
        raise _engine_problem(e, "load it") from e
    for n, sample in enumerate(feeds):
        if progress:
            progress(f"collecting activations: sample {n + 1}/{len(feeds)}")
        try:
            values = dict(run(sample)) if run is not None else {}
        except ValidationError:  # (a feed that does not fit, an output of another type: named already)
            raise
        except Exception as e:  # noqa: BLE001 - ONNX Runtime refusing a sample (an index out of range)
            raise _engine_problem(e, f"run it on sample {n + 1}") from e
        for i in inputs:
            x = np.asarray(sample[i.value] if i.value in fed else values[i.value])
            if x.ndim == 0 or x.shape[-1 if not i.transposed else 0] != i.k:
                raise ActivationError([Problem(f"activation {i.value!r}", f"shape {list(x.shape)} on sample {n + 1}",
                                               f"rows of {i.k} (the weight's reduction axis)")])
            rows = (x.T if i.transposed else x).reshape(-1, i.k)
            if not np.isfinite(rows.astype(np.float32)).all():
                raise ActivationError([Problem(f"activation {i.value!r}", f"NaN or infinity on sample {n + 1}",
                                               "finite values (calibrate on inputs the model computes finite values for)")])
            stats[i].add(rows)
        del values
    return stats


class MappedWeights:
    """The model's big initializers (those `evaluate.OnOrt` feeds apart: over plumbing.light.BIG)
    written once to a scratch file, each pass's ONNX Runtime session fed them mapped from it
    (`arrays()`, read-only np.memmap) rather than as arrays read into memory for every pass.

    Why: a pass exposes one group's layer inputs, and ONNX Runtime runs only the nodes those
    need, so the weights of the layers after them, and the rows of an embedding no token
    indexes, are never read: mapped, their pages are never brought in, where read into memory
    each pass held every weight's copy (MiniLM: 0.5x the model) beside the model the caller
    holds.  The values fed are the same arrays, so the activations (and the codes) are bit for
    bit those of arrays in memory.  The file is the weights' bytes once on disk (in the system's
    temporary folder), removed by `close()` (or when this is collected)."""

    def __init__(self, model: onnx.ModelProto, loaded=None):
        import os
        import tempfile
        import weakref

        from dyndq.model_files import tensor_array
        from dyndq.plumbing.light import BIG, nbytes

        self.layout = {}  # name -> (dtype, shape, offset)
        folder = tempfile.mkdtemp(prefix="dyndq-calibration-")
        self.path = os.path.join(folder, "weights.bin")
        self._finalizer = weakref.finalize(self, _remove, folder)
        with open(self.path, "wb") as f:
            for t in model.graph.initializer:
                if nbytes(t) <= BIG or t.name in self.layout:
                    continue
                a = onnx.numpy_helper.to_array(t) if loaded is None else tensor_array(t, loaded)
                if a.dtype.hasobject or not a.size:
                    continue
                offset = -(-f.tell() // 64) * 64
                f.seek(offset)
                f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
                self.layout[t.name] = (a.dtype, a.shape, offset)
                del a

    def arrays(self) -> dict:
        """{name: a read-only array mapped from the file}: one pass's (its pages go with it)."""
        return {name: np.memmap(self.path, dtype, "r", offset, shape) for name, (dtype, shape, offset) in self.layout.items()}

    def close(self) -> None:
        self._finalizer()


def _remove(folder: str) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)


def _engine_problem(e: Exception, what: str) -> ActivationError:
    from dyndq.wording import first_line

    return ActivationError([Problem("model", f"ONNX Runtime could not {what} to collect the layers' inputs: "
                                             f"{first_line(e)}",
                                    "a model and inputs ONNX Runtime runs (a data-aware method calibrates on them)")])
