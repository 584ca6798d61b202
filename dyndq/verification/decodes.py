"""Where a quantized model holds its weights: every value a node reads that a constant subgraph
holding a DynamicDequantize (or a float initializer: a float tensor reshaped, cast) computes
(a decode), and every float weight read as stored.

The model is lifted first (`dyndq.lift`: DequantizeLinear, MatMulNBits and GatherBlockQuantized
become our op, value for value), so one search finds every form the house reads.  A decode's
float value is what the reference engine (our kernel) computes of its nodes alone.  Where the
decode is one DynamicDequantize of stored codes, scales and zero points followed only by nodes
that move values (Slice, Transpose, Reshape, ...), `index_map` says which element of the
DynamicDequantize's output lands where in the weight: that is how the codes are compared with
round-to-nearest of the source, whatever the layout between them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from dyndq.opdefs import DOMAIN

FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
# nodes that only move or re-type values: a decode made of one DynamicDequantize and these has an index map
MOVES = {"Identity", "Transpose", "Reshape", "Slice", "Squeeze", "Unsqueeze", "Flatten", "Cast"}


@dataclass
class Decode:
    """A weight the model computes from stored codes: `value` (the name its reader reads)."""

    value: str
    nodes: list  # the constant nodes computing it, in graph order
    reader: str  # the op type of the node reading it ("MatMul", "Gemm", "Gather", ...)
    decoder: onnx.NodeProto | None  # the one DynamicDequantize when the rest only moves values
    quantized: bool = True  # False: no DynamicDequantize, a float tensor moved or cast (a Transpose of it)

    @property
    def codes_name(self) -> str | None:
        return self.decoder.input[0] if self.decoder is not None else None


def lifted(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every form the lift knows as our op (a copy; the model passed in stays)."""
    from dyndq.lifter import lift_with_report

    out, _ = lift_with_report(model)
    return out


_INDEXED: dict[int, tuple[onnx.ModelProto, dict]] = {}  # id(model) -> (the model, its initializers by name)


def _initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """The model's initializers by name, indexed once per model verify searches (rebuilt for each
    weight, it made a model of many weights cost its count squared); `forget` drops the index."""
    hit = _INDEXED.get(id(model))
    if hit is not None and hit[0] is model and len(hit[1]) == len(model.graph.initializer):
        return hit[1]
    index = {t.name: t for t in model.graph.initializer}
    _INDEXED[id(model)] = (model, index)
    return index


def forget() -> None:
    """Drop the initializers' indexes and the decodes' values (held for one verify)."""
    _INDEXED.clear()
    _VALUES.clear()


def find(model: onnx.ModelProto) -> tuple[list[Decode], dict[str, str]]:
    """(the decodes of the main graph, {float initializer of more than one element a node reads as
    stored: its reader's op}), for a lifted model."""
    inits = _initializers(model)
    made_by = {o: n for n in model.graph.node for o in n.output}
    order = {id(n): i for i, n in enumerate(model.graph.node)}
    constant: dict[str, bool] = {}

    def is_constant(value: str) -> bool:
        if not value or value in inits:
            return True
        if value in constant:
            return constant[value]
        node = made_by.get(value)
        constant[value] = False  # (a cycle, which a valid graph has not, ends here)
        ok = node is not None and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                          for a in node.attribute) and \
            not node.op_type.startswith("Random") and all(is_constant(i) for i in node.input)
        constant[value] = ok
        return ok

    def producers(value: str, seen: dict) -> None:
        node = made_by.get(value)
        if node is None or id(node) in seen:
            return
        seen[id(node)] = node
        for i in node.input:
            producers(i, seen)

    decodes, floats, done = [], {}, set()
    for node in model.graph.node:
        if is_constant(node.output[0] if node.output else ""):
            continue
        for i, value in enumerate(node.input):
            if value in done or not value:
                continue
            if value in inits:
                t = inits[value]
                if t.data_type in FLOATS and int(np.prod(t.dims)) > 1:
                    floats[value] = node.op_type
                    done.add(value)
                continue
            if not is_constant(value):
                continue
            seen: dict = {}
            producers(value, seen)
            nodes = sorted(seen.values(), key=lambda n: order[id(n)])
            ddq = [n for n in nodes if n.op_type == "DynamicDequantize" and n.domain == DOMAIN]
            if not ddq and not any(i in inits and inits[i].data_type in FLOATS and int(np.prod(inits[i].dims)) > 1
                                   for n in nodes for i in n.input):
                continue  # (no codes and no float weight: a shape, an index computed)
            done.add(value)
            decoder = ddq[0] if len(ddq) == 1 and all(x in inits for x in ddq[0].input if x) and all(
                n.op_type in MOVES for n in nodes if n is not ddq[0] and _after(n, ddq[0], made_by)) else None
            decodes.append(Decode(value, nodes, node.op_type, decoder, bool(ddq)))
    return decodes, floats


def _after(node: onnx.NodeProto, decoder: onnx.NodeProto, made_by: dict) -> bool:
    """Whether `node` reads the decoder's output, at any depth."""
    stack, seen = list(node.input), set()
    while stack:
        v = stack.pop()
        if v == decoder.output[0]:
            return True
        if v in seen or v not in made_by:
            continue
        seen.add(v)
        stack.extend(made_by[v].input)
    return False


def _sub_model(model: onnx.ModelProto, nodes: list, output: str, inputs=()) -> onnx.ModelProto:
    inits = _initializers(model)
    used = {i for n in nodes for i in n.input} - {i.name for i in inputs}
    graph = helper.make_graph(list(nodes), "decode", list(inputs), [helper.make_empty_tensor_value_info(output)],
                              [inits[name] for name in sorted(used) if name in inits])
    sub = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return sub


_VALUES: dict[tuple[int, str], np.ndarray] = {}  # (id(model), value) -> its decode's value, computed with others


def value_of(model: onnx.ModelProto, decode: Decode) -> np.ndarray:
    """The decode's float value, as the reference engine (our kernel) computes it (one `compute_all`
    gave, or its nodes alone)."""
    hit = _VALUES.get((id(model), decode.value))
    if hit is not None and _INDEXED.get(id(model), (None,))[0] is model:
        return hit
    return computed_alone(model, decode)


def computed_alone(model: onnx.ModelProto, decode: Decode) -> np.ndarray:
    """The decode's value from a model of its nodes alone, on the reference engine (where
    `compute_all`'s one run failed, or its values were forgotten)."""
    from dyndq.reference import reference_evaluator

    sub = _sub_model(model, decode.nodes, decode.value)
    return np.asarray(reference_evaluator(sub).run(None, {})[0])


def compute_all(model: onnx.ModelProto, decodes: list[Decode]) -> None:
    """Every decode's value in one run of the reference engine over all their nodes (one model, one
    session: a model per decode cost most of a verify of many small weights), held for `value_of`
    until `forget`.  Where that run fails (a node the engine refuses), each is computed alone when
    asked, and the failure said there."""
    from dyndq.reference import reference_evaluator

    if not decodes:
        return
    order = {id(n): i for i, n in enumerate(model.graph.node)}
    nodes = {id(n): n for d in decodes for n in d.nodes}
    outputs = list(dict.fromkeys(d.value for d in decodes))
    sub = _sub_model(model, sorted(nodes.values(), key=lambda n: order.get(id(n), -1)), outputs[0])
    del sub.graph.output[:]
    sub.graph.output.extend(helper.make_empty_tensor_value_info(o) for o in outputs)
    try:
        with np.errstate(all="ignore"):
            got = reference_evaluator(sub).run(None, {})
    except Exception:  # noqa: BLE001 - (computed alone instead, where the failure is said against its weight)
        return
    _initializers(model)  # (indexed: value_of's hits are checked against it)
    for name, value in zip(outputs, got):
        _VALUES[(id(model), name)] = np.asarray(value)


def index_map(model: onnx.ModelProto, decode: Decode, shape: tuple) -> np.ndarray | None:
    """For each element of the weight, the flat index of the element of the DynamicDequantize's
    output it is (int64, the weight's shape); None when the decode is not one DynamicDequantize
    followed by nodes that only move values."""
    from dyndq.reference import reference_evaluator

    if decode.decoder is None:
        return None
    made_by = {o: n for n in decode.nodes for o in n.output}  # (the decode's own: what lies between it and its decoder)
    nodes = []
    for n in decode.nodes:
        if n is decode.decoder:
            continue
        if n.op_type == "Cast" and _after(n, decode.decoder, made_by):  # (an index is no float: pass it on as it is)
            n = helper.make_node("Identity", [n.input[0]], list(n.output))
        nodes.append(n)
    start = decode.decoder.output[0]
    if start == decode.value:
        return np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    feed = helper.make_tensor_value_info(start, onnx.TensorProto.INT64, list(shape))
    sub = _sub_model(model, nodes, decode.value, [feed])
    return np.asarray(reference_evaluator(sub).run(None, {start: np.arange(int(np.prod(shape)), dtype=np.int64)
                                                                   .reshape(shape)})[0])


def stored(model: onnx.ModelProto, name: str) -> np.ndarray:
    return numpy_helper.to_array(_initializers(model)[name])


def prepared(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model as verify searches it (a copy): model-local functions inlined at their calls
    (onnx's own inliner: a weight a function holds, or is given as an input by its call, is then
    the caller's, decoded where it is called), each graph's Constant tensors made initializers (a
    function's weights are Constants), then lifted (`lifted`: inside a function, whose inputs
    have no shapes, the lift leaves a DequantizeLinear alone; inlined, it is taken)."""
    from onnx import inliner

    from dyndq.plumbing.walk import graphs

    if not model.functions and not any(_constant_tensor(n) or _reshaped_codes(g, n) or n.op_type in INTEGER_MATMULS
                                       for g in graphs(model.graph) for n in g.node):
        return lifted(model)  # (nothing to change before the lift, which copies: no second copy of the weights)
    out = inliner.inline_local_functions(model) if model.functions else onnx.ModelProto()
    if not model.functions:
        out.CopyFrom(model)
    for g in graphs(out.graph):
        constants = [n for n in g.node if _constant_tensor(n)]
        for n in constants:
            g.initializer.append(_as_initializer(n))
            g.node.remove(n)
        for n in [n for n in g.node if _reshaped_codes(g, n)]:
            inits = {t.name: t for t in g.initializer}
            data, shape = numpy_helper.to_array(inits[n.input[0]]), numpy_helper.to_array(inits[n.input[1]])
            g.initializer.append(numpy_helper.from_array(data.reshape(shape), n.output[0]))
            g.node.remove(n)
        _integer_weights_dequantized(g)
    return lifted(out)


INTEGER_MATMULS = ("MatMulInteger", "QLinearMatMul")


def _integer_weights_dequantized(graph: onnx.GraphProto) -> None:
    """ONNX Runtime's QOperator MatMuls (quantize_dynamic's MatMulInteger, whose weight scale is
    found where the graph multiplies the int32 product by it, and quantize_static's QLinearMatMul)
    on a stored weight: a DequantizeLinear of its codes, scale and zero point read by a MatMul of
    the float input they quantized, added beside them (their outputs read by nothing: `prepared`
    serves the weights' search, never a run), so the lift makes it our op and the weight is judged
    as any QDQ one.  A form whose scale is not found so stays (said unmatched)."""
    inits = {t.name: t for t in graph.initializer}
    made_by = {o: n for n in graph.node for o in n.output}
    readers: dict = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)

    def only_reader(value, op):
        found = readers.get(value, [])
        return found[0] if len(found) == 1 and found[0].op_type == op else None

    added, decoded = [], set()  # (the codes given a DequantizeLinear: once each, however many nodes read them)
    for n in graph.node:
        if n.op_type not in INTEGER_MATMULS or n.domain not in ("", "ai.onnx"):
            continue
        if n.op_type == "MatMulInteger":  # (A, B, a_zero_point, b_zero_point): B's scale multiplies the product
            codes, zero = n.input[1], (n.input[3] if len(n.input) > 3 else "")
            quantizer = made_by.get(n.input[0])
            cast = only_reader(n.output[0], "Cast")
            mul = cast is not None and only_reader(cast.output[0], "Mul")
            product = mul and made_by.get(next((i for i in mul.input if i != cast.output[0]), ""))
            # (the product of A's scale and B's, in that order as ONNX Runtime writes it: both stored where A
            # is a table's codes gathered)
            scale = product is not None and product and product.op_type == "Mul" and \
                next((i for i in reversed(product.input) if i in inits), None)
            wanted = "DynamicQuantizeLinear"
        else:  # (a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point)
            codes, scale, zero = n.input[3], n.input[4], n.input[5]
            quantizer, wanted = made_by.get(n.input[0]), "QuantizeLinear"
        if not scale or scale not in inits or codes not in inits or (zero and zero not in inits) or codes in decoded:
            continue
        decoded.add(codes)
        # (the reader's input: the float the codes' partner quantized, else the integer input itself, which only
        # makes the reader no constant for `find`: this graph is searched, never run)
        read_from = quantizer.input[0] if quantizer is not None and quantizer.op_type == wanted else n.input[0]
        per_column = len(inits[scale].dims) == 1 and inits[scale].dims[0] > 1
        dequantized, read = f"{codes}_verify_dequantized", f"{codes}_verify_read"
        added += [helper.make_node("DequantizeLinear", [codes, scale] + ([zero] if zero else []), [dequantized],
                                   name=f"{codes}_verify_dequantize", **({"axis": 1} if per_column else {})),
                  helper.make_node("MatMul", [read_from, dequantized], [read], name=f"{codes}_verify_read")]
        table = quantizer if quantizer is not None and quantizer.op_type == "Gather" else None
        if n.op_type == "MatMulInteger" and table is not None and table.input[0] in inits and \
                table.input[0] not in decoded:
            # (quantize_dynamic's embedding: its codes gathered straight into A, A's scale the product's other
            # factor, its zero point A's; decoded so too, read by a Gather)
            a_scale = next((i for i in product.input if i in inits and i != scale), None)
            a_zero = n.input[2] if len(n.input) > 2 and n.input[2] in inits else ""
            if a_scale is not None and (a_zero or len(n.input) < 3 or not n.input[2]):
                decoded.add(table.input[0])
                rows = f"{table.input[0]}_verify_dequantized"
                added += [helper.make_node("DequantizeLinear", [table.input[0], a_scale] + ([a_zero] if a_zero else []),
                                           [rows], name=f"{table.input[0]}_verify_dequantize"),
                          helper.make_node("Gather", [rows, table.input[1]], [f"{table.input[0]}_verify_read"],
                                           name=f"{table.input[0]}_verify_read",
                                           **{a.name: helper.get_attribute_value(a) for a in table.attribute})]
    graph.node.extend(added)


def _reshaped_codes(graph: onnx.GraphProto, node: onnx.NodeProto) -> bool:
    """A Reshape of stored codes by a stored shape, feeding a GatherBlockQuantized's data: the model
    builder's tied embedding reads the lm_head's MatMulNBits codes so.  Folded into a stored tensor
    before the lift, which takes a GatherBlockQuantized of stored codes only."""
    if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return False
    names = {t.name: t for t in graph.initializer}
    if node.input[0] not in names or node.input[1] not in names or \
            names[node.input[0]].data_type not in (onnx.TensorProto.UINT8, onnx.TensorProto.INT8):
        return False
    shape = numpy_helper.to_array(names[node.input[1]])
    return bool((shape > 0).all()) and any(n.op_type == "GatherBlockQuantized" and n.input and n.input[0] == node.output[0]
                                           for n in graph.node)


def scopes(model: onnx.ModelProto) -> list[tuple[str, onnx.ModelProto]]:
    """(where, a model to search with `find`) for the main graph and every If/Loop/Scan body at any
    depth, of a `prepared` model.  A body's model holds the nodes and initializers of the graphs enclosing it before its own
    (what its nodes may read by name), so a decode in it, or read in it, is found as in the main
    graph."""
    from dyndq.plumbing.walk import subgraph_path, subgraphs

    out = []

    def visit(where: str, graph: onnx.GraphProto, nodes: list, inits: list) -> None:
        nodes = nodes + list(graph.node)
        inits = inits + list(graph.initializer)
        if where == "main":
            out.append((where, model))  # (the model itself: no copy of a big model's weights)
        else:
            scope = helper.make_model(helper.make_graph(nodes, where, [], [], inits),
                                      opset_imports=list(model.opset_import), ir_version=model.ir_version)
            out.append((where, scope))
        for i, node in enumerate(graph.node):
            for label, g in subgraphs(node):
                visit(subgraph_path(where, node, i, label), g, nodes, inits)

    visit("main", model.graph, [], [])
    return out


def _constant_tensor(node: onnx.NodeProto) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1 and \
        any(a.name == "value" for a in node.attribute)


def _as_initializer(node: onnx.NodeProto) -> onnx.TensorProto:
    t = onnx.TensorProto()
    t.CopyFrom(next(a.t for a in node.attribute if a.name == "value"))
    t.name = node.output[0]
    return t


class FunctionOrigins:
    """Which model-local function a decode found after inlining comes from (scopes inlines them):
    a decode computing a value the model's graphs do not name came from a function's body (the
    inliner names a body's value NAME__N); a decode whose stored codes a call passes in is that
    function's input."""

    def __init__(self, model: onnx.ModelProto):
        from dyndq.plumbing.walk import function_path, graphs

        local = {(f.domain, f.name): f for f in model.functions}
        self.named = {o for g in graphs(model.graph) for n in g.node for o in n.output} | \
            {t.name for g in graphs(model.graph) for t in g.initializer}
        self.bodies: dict[str, set] = {}  # a function body's value name -> the functions naming it
        for f in model.functions:
            for n in f.node:
                for o in n.output:
                    self.bodies.setdefault(o, set()).add(function_path(f))
        self.inputs: dict[str, list] = {}  # a value a call passes in -> (function, formal input, call)
        for g in graphs(model.graph):
            for i, n in enumerate(g.node):
                f = local.get((n.domain, n.op_type))
                for value, formal in zip(n.input, f.input if f is not None else []):
                    self.inputs.setdefault(value, []).append((function_path(f), formal, n.name or f"{n.op_type}#{i}"))

    def of(self, d: Decode) -> str | None:
        """How to say where the decode is, when it came from a function; None when it did not."""
        import re

        made = [o for n in d.nodes for o in n.output  # (a value the inliner renamed: NAME__N of a body's NAME)
                if o and o not in self.named and re.sub(r"__\d+$", "", o) in self.bodies]
        if not made:
            return None
        leaves = {i for n in d.nodes for i in n.input} - {o for n in d.nodes for o in n.output}
        given = [c for leaf in sorted(leaves) for c in self.inputs.get(leaf, [])]
        if given:  # (the first stored input the call gives: the codes, before the scales)
            f, formal, call = given[0]
            return f"in {f} (its input {formal!r}, given by call {call!r})"
        functions = sorted({f for o in made for f in self.bodies[re.sub(r"__\d+$", "", o)]})
        return f"in {' or '.join(functions)} (inlined at its call)"
