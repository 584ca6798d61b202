"""Weight by weight: each quantized weight matched to its source tensor and given one status.

The source is a float ONNX model (its float initializers) or a checkpoint (its tensors, each its
format's own dequantization, `dyndq.checkpoints`).  A weight (the value its reader reads) is
matched to a source tensor, in this order: by name (the value read, then the values its decode
computes before it: a Transpose's input); for a checkpoint, by its format's name map; by the
stored codes' name less the suffix ONNX Runtime's quantizer adds ("_Q4", "_quantized", ...); by
the reader node's name, less that suffix; then by shape and closeness, as the import matches
(dyndq.checkpoints.matching: the closest below CLOSE_ENOUGH).

Statuses (docs/verify.md): identical, rtn, requantized, layout (with its kind), differs (matched,
but neither of those), unmatched, float (a weight left float, equal to its source or not).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from dyndq.checkpoints.matching import CLOSE_ENOUGH, STORED, TRANSPOSED, Weight, orientation, relative_error
from dyndq.verification import codes as C
from dyndq.verification.decodes import (Decode, FunctionOrigins, compute_all, find, forget, index_map, prepared, scopes,
                                        stored, value_of)

FAITHFUL = ("identical", "rtn", "float")
_SUFFIX = re.compile(r"(_DQ)?(_Q[248]|_quantized|_qdq|_dequantized|_DequantizeLinear(_Output)?|_weight)+$")


# the quantized ops whose float inputs (scales) are no weight left float: one still there was not lifted
# (NNCF 3.4's MatMulNBits with zero points [N, blocks], a shape ONNX Runtime refuses too)
UNLIFTED = ("MatMulNBits", "GatherBlockQuantized", "DequantizeLinear")
# integer ops computing on stored integer weights (ONNX Runtime's QOperator forms: quantize_dynamic's
# MatMulInteger, quantize_static's QLinearMatMul, ...), by the input holding the weight: where
# decodes.prepared finds no scale and float input to decode it by (the MatMuls it takes:
# decodes.INTEGER_MATMULS), each such weight is said unmatched (a finding), never left out of the
# report (a model of only these once verified "faithful" with no weight compared)
INTEGER_WEIGHT = {"MatMulInteger": 1, "ConvInteger": 1, "DynamicQuantizeMatMul": 1, "MatMulIntegerToFloat": 1,
                  "QLinearMatMul": 3, "QLinearConv": 3, "QGemm": 3, "QAttention": 1}


@dataclass
class WeightVerdict:
    weight: str
    source: str | None
    status: str
    kind: str | None = None
    codes_off: int | None = None
    error: float | None = None
    rule: str | None = None  # the RTN rule compared against, named
    matched: str | None = None  # how the source was found
    note: str = ""
    also: str | None = None  # another quantizer's rule that gives the very same codes (said once per report)
    # the weight's values as the source tensor is laid out (its decode, evaluated on demand: blame.py
    # swaps them into the float source); None for an unmatched weight
    decoded: Callable[[], np.ndarray] | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict:
        out = {"weight": self.weight, "source": self.source, "status": self.status}
        for key in ("kind", "codes_off", "error", "rule", "matched"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.note:
            out["note"] = self.note
        return out

    @property
    def faithful(self) -> bool:
        return self.status in FAITHFUL and not (self.status == "float" and self.error)


def bare(name: str) -> str:
    return _SUFFIX.sub("", name)


# -- the source side ---------------------------------------------------------------------------

class OnnxSource:
    """A float ONNX model's weights: its float initializers, as its nodes read them."""

    kind = "onnx"

    def __init__(self, model: onnx.ModelProto):
        self.squared_norms: dict[str, float] = {}  # (by_closeness' screen: each source tensor's, once)
        from dyndq.checkpoints.matching import FLOATS as FLOAT_TYPES
        from dyndq.checkpoints.matching import constant_tensors, float_weights
        from dyndq.plumbing.walk import graphs

        self.model = model  # (the model run for the outputs, as given)
        searched = model
        if model.functions:  # (a function's Constants searched where its calls are, as the quantized model's are)
            from onnx import inliner

            searched = inliner.inline_local_functions(model)
        self.weights = float_weights(searched)
        self._tensors = {**constant_tensors(searched.graph), **{t.name: t for t in searched.graph.initializer}}
        every = list(graphs(searched.graph))
        for g in every[1:]:  # (If/Loop/Scan bodies: their float initializers and Constants too)
            for name, t in {**constant_tensors(g), **{t.name: t for t in g.initializer}}.items():
                if t.data_type in FLOAT_TYPES and int(np.prod(t.dims)) > 1 and name not in self.weights:
                    self.weights[name] = Weight(name, tuple(t.dims), t.data_type)
                    self._tensors[name] = t
        # a float weight the source reads through a Transpose of it (the model builder's tied embedding:
        # Gather(Transpose(lm_head's weight))): the Transpose's output is a source tensor too, a view of
        # the weight, matched as any other but never listed unused (its weight is)
        self.views: dict[str, tuple[str, list[int]]] = {}
        for node in searched.graph.node:
            if node.op_type == "Transpose" and node.domain in ("", "ai.onnx") and node.input and \
                    node.input[0] in self.weights and node.output[0] not in self.weights:
                base = self.weights[node.input[0]]
                perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None) or \
                    list(range(len(base.shape)))[::-1]
                self.views[node.output[0]] = (base.name, perm)
                self.weights[node.output[0]] = Weight(node.output[0], tuple(base.shape[i] for i in perm), base.dtype)
        self.readers = {}  # node name -> {input index: initializer}
        for node in (n for g in every for n in g.node):
            for i, name in enumerate(node.input):
                if name in self.weights:
                    self.readers.setdefault(node.name, {})[i] = name

    def values(self, name: str) -> np.ndarray:
        """The weight in its own type (float16 rounds to nearest in float16, as ONNX Runtime's
        quantizer reads it: matching's float32 copies would give other codes)."""
        if name in self.views:
            base, perm = self.views[name]
            return np.transpose(self.values(base), perm)
        return numpy_helper.to_array(self._tensors[name])

    def names(self) -> list[str]:
        return list(self.weights)

    def lookup(self, name: str) -> list[tuple[str, str]]:
        """(source tensor, how) a weight of this name may be: the initializer of that name."""
        return [(name, "by name")] if name in self.weights else []

    def by_reader(self, node: str | None, index: int | None) -> str | None:
        """The initializer the source's node of that name (less the lift's suffixes) reads at `index`."""
        for candidate in (node, bare(node or "")):
            if not candidate:  # (an unnamed node names nothing: not the source's unnamed ones)
                continue
            name = self.readers.get(candidate, {}).get(index)
            if name is not None:
                return name
        return None

    def fits(self, name: str, shape, reads) -> bool:
        return tuple(self.weights[name].shape) == tuple(shape)

    def oriented_for(self, name: str, shape, reads) -> np.ndarray:
        return self.values(name)  # (a float model's weight is read as the quantized model reads it)


class CheckpointSource:
    """A checkpoint's tensors (its format's own dequantization), oriented as the model reads them."""

    kind = "checkpoint"

    def __init__(self, checkpoint):
        self.squared_norms: dict[str, float] = {}  # (by_closeness' screen: each source tensor's, once)
        self.checkpoint = checkpoint
        self.tensors = {t.name: t for t in checkpoint.tensors()}
        self._cache: dict[str, np.ndarray] = {}
        from dyndq.verification.layouts import WrongLayouts

        self._wrong = WrongLayouts(checkpoint, self.tensors)

    def names(self) -> list[str]:
        return list(self.tensors)

    def values(self, name: str) -> np.ndarray:
        if name not in self._cache:
            with np.errstate(all="ignore"):
                self._cache[name] = np.asarray(self.tensors[name].values(), np.float32)
        return self._cache[name]

    def lookup(self, name: str) -> list[tuple[str, str]]:
        """(tensor, how): the tensor of that name, and the one the format's name map gives it."""
        out = [(name, "by name")] if name in self.tensors else []
        mapped = self.checkpoint.mapped_name(name)
        if mapped in self.tensors and mapped != name:
            out.append((mapped, f"by {self.checkpoint.format}'s name map"))
        return out

    def by_reader(self, node, index):
        return None

    def fits(self, name: str, shape, reads) -> bool:
        return orientation(self.tensors[name].shape, Weight(name, tuple(shape), onnx.TensorProto.FLOAT, set(reads))) is not None

    def oriented_for(self, name: str, shape, reads) -> np.ndarray:
        w = Weight(name, tuple(shape), onnx.TensorProto.FLOAT, set(reads))
        way = orientation(self.tensors[name].shape, w)
        v = self.values(name)
        return np.swapaxes(v, -1, -2) if way == TRANSPOSED else v  # (a 3-D tensor of experts: each expert's matrix)

    def wrong_layouts(self, name: str, shape, reads) -> list[tuple[str, str, np.ndarray]]:
        """(kind, note, values as the model reads them) of each known wrong reading of tensor `name`
        (layouts.py: llama.cpp's Q/K rows not un-permuted, AWQ's nibbles read in plain order)."""
        way = orientation(self.tensors[name].shape, Weight(name, tuple(shape), onnx.TensorProto.FLOAT, set(reads)))
        return [(kind, note, np.swapaxes(v, -1, -2) if way == TRANSPOSED else v) for kind, note, v in self._wrong.of(name)]


def _reads(reader: str) -> set:
    return {TRANSPOSED} if reader == "MatMul" else {STORED}


def by_closeness(shape, value: np.ndarray, source, taken: set, reads) -> tuple[str, float] | None:
    """The source tensor fitting this shape (a checkpoint's: either way round) closest to `value`,
    below CLOSE_ENOUGH, as the import matches by shape.  Each candidate is first screened by one
    float32 dot product (||a - b||^2 = ||a||^2 + ||b||^2 - 2 a.b, the transposed ones compared with
    `value` transposed, so no candidate is copied): its exact error (float64, two passes) is computed
    only for those the screen puts below SCREEN, far above any rounding of the screen.  Computing it
    for every same-shaped tensor made MiniLM's 36 matches take most of a verify's time."""
    best = None
    flat = {False: np.ascontiguousarray(value, np.float32).ravel()}
    for name in source.names():
        if name in taken or not source.fits(name, shape, reads):
            continue
        theirs = source.oriented_for(name, shape, reads)
        if _screened(flat, np.asarray(theirs), source, name) >= SCREEN:
            continue
        error = relative_error(value, theirs)
        if np.isfinite(error) and error < CLOSE_ENOUGH and (best is None or error < best[1]):
            best = (name, error)
    return best


SCREEN = 2 * CLOSE_ENOUGH  # (unrelated weights are about 1.4 apart; the screen's rounding is below 1e-3)


def _screened(flat: dict, theirs: np.ndarray, source, name: str) -> float:
    """The relative error of `flat[False]` (the weight, flattened) against `theirs` from one dot
    product; `flat[True]` is the weight transposed, made once, for a candidate that is a transpose."""
    transposed = not theirs.flags.c_contiguous and theirs.ndim == 2 and theirs.T.flags.c_contiguous
    if transposed and True not in flat:
        flat[True] = np.ascontiguousarray(flat[False].reshape(theirs.shape).T).ravel()
    b = np.ascontiguousarray(theirs.T if transposed else theirs, np.float32).ravel()
    a = flat[transposed]
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return 0.0  # (not screened: the exact error says what it is)
    norms = source.squared_norms
    if name not in norms:
        norms[name] = float(np.dot(b, b))
    bb, aa, ab = norms[name], float(np.dot(a, a)), float(np.dot(a, b))
    if bb == 0.0:
        return 0.0
    return float(np.sqrt(max(aa + bb - 2.0 * ab, 0.0) / bb))


# -- the verdicts ------------------------------------------------------------------------------

def verify_weights(quantized: onnx.ModelProto, source, hold: bool = False) -> tuple[list[WeightVerdict], list[str]]:
    """(a verdict per weight of `quantized`, the source tensors no weight matched).  Weights are
    sought in the main graph, in every If/Loop/Scan body, and in model-local functions, inlined at
    their calls (decodes.scopes); one found in a body says where in its note.  `hold`: the decodes'
    values stay held for the verdicts' `decoded` (blame swaps them in) until the caller's
    `decodes.forget()`; otherwise they are let go here, and `decoded` computes one alone."""
    done = False
    try:
        out = _verify_weights(quantized, source)
        done = True
        return out
    finally:
        if not (hold and done):
            forget()  # (the decodes' values and indexes held for this verify let go)


def _verify_weights(quantized: onnx.ModelProto, source) -> tuple[list[WeightVerdict], list[str]]:
    from dyndq.plumbing.walk import graphs

    known = {t.name for g in graphs(quantized.graph) for t in g.initializer} | \
        {o for g in graphs(quantized.graph) for n in g.node for o in n.output}
    origins = FunctionOrigins(quantized) if quantized.functions else None  # (named before `prepared` inlines them)
    model = prepared(quantized)
    decodes, floats, seen = [], [], set()  # (where, the scope's model, a decode or float weight), each value once
    unread = []  # (where, the stored weight of an integer op, that op)
    for where, model in scopes(model):
        found_decodes, found_floats = find(model)
        # (a decoder's scales, which a QOperator MatMulInteger's graph also multiplies its product by: no float
        # weight, nor is their product)
        scales = {i for d in found_decodes if d.decoder is not None for i in d.decoder.input[1:]}
        found_decodes = [d for d in found_decodes if d.quantized or not all(i in scales for n in d.nodes for i in n.input)]
        compute_all(model, [d for d in found_decodes if d.value not in seen])
        decodes += [(where, model, d) for d in found_decodes if d.value not in seen]
        seen.update(d.value for d in found_decodes)
        seen.update(scales)
        floats += [(where, model, name, reader) for name, reader in found_floats.items() if name not in seen]
        seen.update(found_floats)
        stored_names = {t.name for t in model.graph.initializer}
        integer_read = {v for n in model.graph.node if n.op_type in INTEGER_WEIGHT for v in n.input}
        decoded = {i for d in found_decodes for n in d.nodes for i in n.input}  # (codes a decode reads: judged)
        for node in model.graph.node:  # (an integer op's stored weight: a form verify does not read)
            i = INTEGER_WEIGHT.get(node.op_type) if node.domain in ("", "ai.onnx", "com.microsoft") else None
            if node.op_type == "Gather" and node.output and node.output[0] in integer_read:
                i = 0  # (a quantized table gathered straight into one: quantize_dynamic's embedding)
            name = node.input[i] if i is not None and len(node.input) > i else ""
            if name and name not in seen and name not in decoded and name in stored_names:
                seen.add(name)
                unread.append((where, name, node))
    readers = {}  # (the reader nodes of each scope, once)

    def shown(d: Decode, name: str) -> str:
        """A name the user's file holds: the value read, or the stored codes of a form the lift rewrote."""
        return next((n for n in (name, d.value, d.codes_name) if n in known), name)

    def placed(verdict: WeightVerdict, where: str, d: Decode | None = None) -> WeightVerdict:
        said = origins.of(d) if origins is not None and d is not None else None
        said = said or (f"in {where}" if where != "main" else None)
        if said:
            verdict.note = said + (f"; {verdict.note}" if verdict.note else "")
        return verdict
    shared = isinstance(source, CheckpointSource)  # (a checkpoint tensor may stand for several weights: tied)
    taken: set = set()
    verdicts = []
    pending = []
    for where, model, d in decodes:
        if id(model) not in readers:
            readers[id(model)] = _reader_nodes(model)
        failed = _fails(model, d)
        if failed:  # (an invalid node, e.g. a blocked DequantizeLinear whose scales have another shape)
            verdicts.append(placed(WeightVerdict(shown(d, d.value), None, "unmatched", note=failed), where, d))
            continue
        found = None
        for name, variant, said in _names_of(model, d):  # the value read, then the values before it
            values = None
            for tensor, how in source.lookup(name):
                how = said or how
                if tensor in taken and not shared:
                    continue
                values = value_of(model, variant) if values is None else values
                if source.fits(tensor, values.shape, _reads(variant.reader)):
                    found = (tensor, how, name, variant, values)
                    break
            if found:
                break
        if found is None:  # through the reader node the lift kept the name of (MatMulNBits "fc1_Q4")
            node, index = readers[id(model)].get(d.value, (None, None))
            tensor = source.by_reader(node, index)
            if tensor is not None and tensor not in taken:
                values = value_of(model, d)
                if source.fits(tensor, values.shape, _reads(d.reader)):
                    found = (tensor, "by its reader node", d.value, d, values)
        if found is None:
            pending.append((where, model, d, value_of(model, d)))
            continue
        tensor, how, name, variant, values = found
        taken.add(tensor)
        verdict = _judge(model, variant, values, source, tensor, how)
        verdict.weight, verdict.decoded = shown(variant, name), _decoded(model, variant)
        verdicts.append(placed(verdict, where, d))
    for where, model, d, value in pending:  # by shape and closeness, once the named ones are taken
        best = by_closeness(value.shape, value, source, taken, _reads(d.reader))
        if best is None:
            verdicts.append(placed(WeightVerdict(shown(d, d.value), None, "unmatched", note="no source tensor of its shape "
                                                 f"by name or within relative error {CLOSE_ENOUGH}"), where, d))
            continue
        taken.add(best[0])
        verdict = _judge(model, d, value, source, best[0], f"by shape and closeness ({best[1]:.3g})")
        verdict.weight, verdict.decoded = shown(d, d.value), _decoded(model, d)
        verdicts.append(placed(verdict, where, d))
    for where, name, node in unread:
        verdicts.append(placed(WeightVerdict(name, None, "unmatched", note=f"the stored weight of {node.op_type} "
                                             f"{node.name!r}, a form verify does not decode (ONNX Runtime's QOperator "
                                             "integer ops): not compared"), where))
    for where, model, name, reader in floats:
        if reader in UNLIFTED:  # (a quantized op's scales: its weight is one verify could not decode)
            verdicts.append(placed(WeightVerdict(name, None, "unmatched", note=f"an input of a {reader} node verify "
                                                 "could not read as a quantized weight (a form it does not take): its "
                                                 "weight is not compared"), where))
            continue
        ours = stored(model, name)
        found = next(((t, how) for t, how in source.lookup(name) if (shared or t not in taken)
                      and source.fits(t, ours.shape, _reads(reader))), None)
        if found is None:
            verdicts.append(placed(WeightVerdict(name, None, "float", note="left float; no source tensor of its name"), where))
            continue
        taken.add(found[0])
        theirs = _theirs(source, found[0], ours.shape, reader)
        equal = C.same_bits(ours.astype(np.float32), theirs.astype(np.float32))
        verdicts.append(placed(WeightVerdict(name, found[0], "float", error=0.0 if equal else relative_error(ours, theirs),
                                             matched=found[1], note="left float" + ("" if equal else
                                                                                     ", not the source's values"),
                                             decoded=lambda model=model, name=name: stored(model, name)), where))
    return verdicts, [n for n in source.names() if n not in taken and n not in getattr(source, "views", {})]


def _fails(model: onnx.ModelProto, d: Decode) -> str:
    """Why the decode's value does not compute on the reference engine ("" where it does): said
    against its weight, which is then compared with nothing."""
    try:
        with np.errstate(all="ignore"):
            value_of(model, d)
    except Exception as e:  # noqa: BLE001 - (whatever the engine raises for a node it refuses: named, not a crash)
        nodes = ", ".join(f"{n.op_type} {n.name!r}" for n in d.nodes)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return f"its decode ({nodes}) does not compute on the reference engine: {first}"
    return ""


def _decoded(model: onnx.ModelProto, d: Decode) -> Callable[[], np.ndarray]:
    return lambda: value_of(model, d)


def _theirs(source, name: str, shape, reader: str) -> np.ndarray:
    """The source tensor's values as the weight's reader reads them (a checkpoint's [out, in] turned
    for MatMul's B)."""
    return source.oriented_for(name, shape, _reads(reader))


def _names_of(model: onnx.ModelProto, d: Decode):
    """(name, the decode computing that value) for each name the weight goes by, nearest first: the
    value read, the values its decode computes before it (a Transpose's input: the weight as the
    exporter named it, as a source model reads it), the stored codes' name less ONNX Runtime's
    suffixes (what the lift keeps of the form the weight came in: "W1_Q4")."""
    yield d.value, d, None
    made_by = {o: n for n in d.nodes for o in n.output}
    inside = d.decoder is not None and _inside(d)
    for node in reversed(d.nodes):
        if node is d.decoder or (d.decoder is not None and not inside.get(id(node), False)):
            continue
        for value in node.output:
            if value and value != d.value:
                yield value, _up_to(d, value, made_by), None
    if d.decoder is not None:
        yield d.decoder.output[0], _up_to(d, d.decoder.output[0], made_by), None
        yield bare(d.codes_name), d, f"by its codes' name ({d.codes_name}, less the quantizer's suffix)"


def _inside(d: Decode) -> dict:
    """id(node) -> whether the node reads the decoder's output (a node after the decode proper)."""
    after = {d.decoder.output[0]}
    out = {}
    for node in d.nodes:
        out[id(node)] = any(i in after for i in node.input)
        if out[id(node)]:
            after.update(node.output)
    return out


def _up_to(d: Decode, value: str, made_by: dict) -> Decode:
    """The part of decode `d` computing `value`, read as the node of `d` reading it reads it."""
    keep, stack = {}, [value]
    while stack:
        node = made_by.get(stack.pop())
        if node is not None and id(node) not in keep:
            keep[id(node)] = node
            stack.extend(node.input)
    nodes = [n for n in d.nodes if id(n) in keep]
    reader = next((n.op_type for n in d.nodes if value in n.input), d.reader)
    return Decode(value, nodes, reader, d.decoder if d.decoder is not None and id(d.decoder) in keep else None,
                  any(n.op_type == "DynamicDequantize" for n in nodes))


def _reader_nodes(model: onnx.ModelProto) -> dict:
    """value -> (the name of the node reading it, bare of the lift's suffixes, the input index)."""
    out = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name and name not in out:
                out[name] = (bare(node.name.split("/")[0]) if node.name else None, i)
    return out


def _judge(model, d: Decode, value: np.ndarray, source, name: str, how: str) -> WeightVerdict:
    raw = _theirs(source, name, value.shape, d.reader)  # (in its own dtype: ONNX Runtime's rules compute in it)
    theirs = raw.astype(np.float32)
    ours32 = value.astype(np.float32)
    error = relative_error(ours32, theirs)
    if theirs.shape != ours32.shape:
        return WeightVerdict(d.value, name, "differs", matched=how, note=f"shape {list(ours32.shape)}, the source's "
                             f"{list(theirs.shape)}")
    if not d.quantized:  # (a float weight moved or cast on its way: left float)
        equal = C.same_bits(ours32, theirs)
        return WeightVerdict(d.value, name, "float", error=0.0 if equal else error, matched=how,
                             note="left float" + ("" if equal else ", not the source's values"))
    if C.same_bits(ours32, theirs):
        return WeightVerdict(d.value, name, "identical", error=0.0, matched=how)
    if source.kind == "checkpoint":  # (a known wrong reading of the checkpoint, bit for bit)
        for kind, note, wrong in source.wrong_layouts(name, value.shape, _reads(d.reader)):
            if wrong.shape == ours32.shape and C.same_bits(ours32, wrong.astype(np.float32)):
                return WeightVerdict(d.value, name, "layout", kind=kind, error=error, matched=how, note=note)
    verdict = _against_rtn(model, d, value, raw, error, name, how) or _by_values(model, d, value, raw, error, name, how)
    if verdict is not None and source.kind == "checkpoint" and verdict.status in ("rtn", "layout"):
        # (round to nearest of the checkpoint's dequantization: another route, which requantized it)
        was = f"{verdict.kind} layout of " if verdict.status == "layout" else ""
        return WeightVerdict(d.value, name, "requantized", error=error, matched=how, rule=verdict.rule, codes_off=None,
                             note=f"its codes are a {was}round to nearest of the checkpoint's dequantization, not "
                                  "the checkpoint's own codes")
    if verdict is not None:
        return verdict
    if error < CLOSE_ENOUGH:
        return WeightVerdict(d.value, name, "requantized", error=error, matched=how,
                             note="not its source's own dequantization" if source.kind == "checkpoint" else "")
    return WeightVerdict(d.value, name, "differs", error=error, matched=how)


def _against_rtn(model, d: Decode, value, theirs, error, name, how) -> WeightVerdict | None:
    """The verdict of a decode of stored codes against round to nearest of its float source
    (None: a decode with no codes to compare, e.g. a composition of several nodes)."""
    if d.decoder is None:
        return None
    codes = stored(model, d.decoder.input[0])
    raw_scales = stored(model, d.decoder.input[1])
    g = C.grouping(d.decoder, codes, raw_scales)
    index = index_map(model, d, codes.shape) if g is not None else None
    if g is None or index is None:
        return None
    scales = C.grouped(raw_scales, g, codes.shape)
    zeros = C.grouped(stored(model, d.decoder.input[2]), g, codes.shape) if len(d.decoder.input) > 2 and \
        d.decoder.input[2] else None
    offsets = C.offsets_of(codes, zeros, g)
    covered = np.zeros(codes.shape, bool)
    covered.reshape(-1)[index.reshape(-1)] = True

    def laid_out(weight: np.ndarray) -> np.ndarray:
        out = np.zeros(codes.shape, weight.dtype)  # (a partial block padded with zeros, as ONNX Runtime pads)
        out.reshape(-1)[index.reshape(-1)] = weight.reshape(-1)
        return out

    candidates = C.rtn_candidates(laid_out(theirs), g, scales.dtype, d.reader) + \
        C.qdq_candidates(laid_out(theirs), g, codes.dtype.name) + C.nncf_candidates(laid_out(theirs), g, scales.dtype)
    if not candidates:
        return None
    for rtn in candidates:
        if C.exact(offsets, scales, zeros, rtn, covered):
            return WeightVerdict(d.value, name, "rtn", error=error, matched=how, rule=rtn.name(g),
                                 also=C.also_nncf(rtn, candidates, offsets, scales, zeros, covered) or None)
    for rtn in candidates:
        found = C.layout(codes, scales, zeros, rtn, g, covered)
        if found is not None:
            return WeightVerdict(d.value, name, "layout", kind=found[0], error=error, matched=how, rule=rtn.name(g),
                                 note=found[1])
    if theirs.ndim == 2 and theirs.shape[0] == theirs.shape[1]:
        flipped = laid_out(theirs.T.copy())
        for rtn in C.rtn_candidates(flipped, g, scales.dtype, d.reader) + C.qdq_candidates(flipped, g, codes.dtype.name) + \
                C.nncf_candidates(flipped, g, scales.dtype):
            if C.exact(offsets, scales, zeros, rtn, covered):
                return WeightVerdict(d.value, name, "layout", kind="transposed", error=error, matched=how,
                                     rule=rtn.name(g), note="its codes are round to nearest of the source transposed")
    # the candidate nearest in values: how far off, in its levels
    decoded = laid_out(np.asarray(value, np.float32))
    theirs = theirs.astype(np.float32)
    nearest = min(candidates, key=lambda r: relative_error(decoded, C.rtn_values(r, g, codes.shape)))
    rtn_error = relative_error(np.asarray(C.rtn_values(nearest, g, codes.shape)).reshape(-1)[index], theirs)
    off = C.levels_off(decoded, C.rtn_values(nearest, g, codes.shape), nearest, g, covered)
    status = "requantized" if off <= C.K_LEVELS or error <= C.REQUANTIZED_ERROR * rtn_error else "differs"
    return WeightVerdict(d.value, name, status, codes_off=off, error=error, matched=how, rule=nearest.name(g),
                         note=f"round to nearest's own error {rtn_error:.3g}")


def _by_values(model, d: Decode, value, theirs, error, name, how) -> WeightVerdict | None:
    """A decode holding one DynamicDequantize of stored codes, with arithmetic after it (an export's
    NaN quieting, a Cast of the scales): its values against each RTN's dequantization, computed on
    the source as the weight reads it, bit for bit (its codes are not compared one by one)."""
    ddq = [n for n in d.nodes if n.op_type == "DynamicDequantize"]
    inits = {t.name for t in model.graph.initializer}
    if len(ddq) != 1 or ddq[0].input[0] not in inits:
        return None
    codes = stored(model, ddq[0].input[0])
    scale_type = _leaf_dtype(model, d, ddq[0].input[1])
    g = C.grouping(ddq[0], codes, None)
    if g is None or g.tensor or theirs.ndim != codes.ndim or any(a > b for a, b in zip(theirs.shape, codes.shape)):
        return None
    for rtn in C.rtn_candidates(theirs, g, scale_type or theirs.dtype, d.reader):
        dequantized = C.rtn_values(rtn, g, rtn.offsets.shape)[tuple(slice(0, s) for s in theirs.shape)]
        if C.same_bits(dequantized.astype(value.dtype), np.asarray(value)):
            return WeightVerdict(d.value, name, "rtn", error=error, matched=how, rule=rtn.name(g),
                                 note="by values: its decode is not one DynamicDequantize alone, so its codes were "
                                      "compared through the values they give")
    return None


def _leaf_dtype(model, d: Decode, value: str):
    """The dtype of the stored tensor a value of the decode is computed from (a Cast's input)."""
    inits = {t.name: t for t in model.graph.initializer}
    made_by = {o: n for n in d.nodes for o in n.output}
    while value not in inits and value in made_by:
        value = made_by[value].input[0]
    return stored(model, value).dtype if value in inits else None
