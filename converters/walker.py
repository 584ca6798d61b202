"""The one walker every rewrite of a model goes through: lift, export (each target) and quantize.

The rules (converters/rules.py) say what to rewrite; this module says how a rewrite is
applied to a model, once for all of them.

A rewrite replaces some nodes of one graph by others and adds the constants they read (a
MatMulNBits into DynamicDequantize + MatMul and back; a DynamicDequantize and the Slice after
it into one DequantizeLinear).  `rewrite_model` asks `convert(node, view)` about every node of
every scope (the main graph, each If/Loop/Scan body at any depth, each model-local function
and the bodies in it) and applies what comes back, so that every command reaches every graph
the same way:

- Children before parents, and in place.  Replacing nodes by `del` + `extend` copies the
  nodes kept, If/Loop/Scan nodes with their bodies among them, and a body collected before
  is then detached: edits made to it afterwards are lost.  So a body is rewritten before the
  graph that holds it, and nodes are removed and inserted one by one, never copied.
- Constants are looked up as ONNX scopes names: an initializer (that is not also a graph
  input) or a Constant node of the graph, else of the graph enclosing it.  In a function,
  Constant nodes are the only constants, and new constants are written as Constant nodes (the
  commands then pass in from the main graph those the function's opset cannot hold, and export
  takes them back in before its rules: dyndq.plumbing.function_inputs).
- One weight, one copy: a new constant is `derived` from a constant of the model (its
  source) with a role; two rewrites deriving equal tensors from one source share one tensor
  (two MatMulNBits reading one B give one set of codes, and back).  New constants stand in
  the scope that holds their source, so a body and its parent share them too.
- Constants outlive the nodes replaced: a Constant node that only replaced nodes read may
  still be read by the new ones (a bias folded into MatMulNBits, a Gather's indices), so no
  rewrite removes one, even one it lists among `replaces`; every constant a rewrite stopped
  reading is removed at the end, once nothing reads it.
- Names given back: once no node reads a source any more it is removed, and when one tensor
  was derived from it in the role "" (the value itself, in another form) that tensor takes
  its name and its place (an initializer's position; a Constant node's).  Lift then export
  gives back the initializers of the model as they were.
- Opset imports: a rewrite names the domains its nodes need (`Rewrite.domains`).  Each is
  imported by the scope (the model or the function) when it is not; for ai.onnx ("") it is a
  minimum, never raised here: a rewrite that needs a newer ai.onnx than its scope imports is
  refused, naming both (raising it would convert every other node of the model).  A domain
  whose nodes were all replaced leaves the scope's imports.

Quantize rewrites constants, not nodes: `rewrite_constants` asks `convert(held, view)` about
every constant of every scope (each initializer, each Constant node's value: a `Held`) and
applies the rewrites the same way (its doc says how its places differ: a constant's nodes
read constants only, so they stand first), reading the constants' values and writing the new
tensors through a `Store` the command hands it.  The quantizer's store reads a model's weights
from its external data one at a time and writes the new tensors to the new data file as the
walker comes to them, in the model's order: the memory stays about one weight and what is
made of it, whatever the model's size.  After it, `settle` passes in from the main graph the
constants a function's opset cannot hold and sets our domain at one version everywhere.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from dyndq.opdefs import Refusal, TensorSpec
from dyndq.plumbing.domain_imports import align
from dyndq.plumbing.function_inputs import pass_out
from dyndq.plumbing.ir import model_ir
from dyndq.plumbing.names import NameScope
from dyndq.plumbing.opsets import ai_onnx_version, drop_opset, import_at_least, scope_opsets
from dyndq.plumbing.types import dtype_name
from dyndq.plumbing.walk import Scope, constant_value, is_constant_node, scopes, scopes_under, with_nested

from .rewrite import GraphView, Rewrite

# (read, store, raw, store_bytes, {name: digest} of the tensors written in bands, let_go) while a model
# whose large constants stay on disk (or beside it in memory) is rewritten (external_constants)
_EXTERNAL: contextvars.ContextVar = contextvars.ContextVar("dyndq_walker_external", default=None)


@contextlib.contextmanager
def external_constants(read: Callable[[onnx.TensorProto], np.ndarray],
                       store: Callable[[onnx.TensorProto], onnx.TensorProto], raw=None, store_bytes=None,
                       let_go=None):
    """Within it, the node rewrites read a constant's value by `read(tensor)` (a tensor whose data
    is in an external file: read from there, one at a time) and hand each new initializer to
    `store(tensor)`, which writes it out and returns what the graph holds (its stub): a model too
    big to hold is rewritten one constant at a time (the streamed import's export).  `raw(tensor)`,
    when given, is a tensor's stored bytes (uint8, in place in its file: GraphView.raw) and
    `store_bytes(name, data_type, dims, chunks)` (model_files.DataFile.stored_bytes) writes a tensor
    a rule makes a band at a time (`written_in_bands`), so that neither is ever whole in memory.
    `let_go(tensor)`, when given (tensors held beside a model in memory: dyndq.held_tensors), is
    handed each constant of a scope as soon as a rewrite taken leaves nothing reading it (`_let_go`):
    a weight's old form goes when its new one exists, not at the model's end."""
    token = _EXTERNAL.set((read, store, raw, store_bytes, {}, let_go))
    try:
        yield
    finally:
        _EXTERNAL.reset(token)


def within_external_constants() -> bool:
    """Whether a caller's `external_constants` is in force (its stubs read through it)."""
    return _EXTERNAL.get() is not None


def written_in_bands(name: str, data_type: int, dims, chunks) -> onnx.TensorProto | None:
    """Within external_constants given a `store_bytes`: the tensor `name` of ONNX type `data_type`
    and `dims` whose raw bytes are `chunks` (bytes-like, in order) written out now, a band at a time
    (its digest taken as it goes, for the sharing of equal tensors), its stub returned for the
    rule's Rewrite; else None (the rule makes the tensor whole).  A rule calls it only once it
    returns the Rewrite: the bytes are written whatever the walker does with it."""
    external = _EXTERNAL.get()
    if external is None or external[3] is None:
        return None
    header = onnx.TensorProto(data_type=data_type, dims=list(dims))
    digest = _Digest(header, True)

    def hashed():
        for chunk in chunks:
            digest.update(chunk)
            yield chunk

    stub = external[3](name, data_type, dims, hashed())
    external[4][name] = digest.digest()
    return stub


@dataclass(frozen=True)
class Outcome:
    """What a converter said of one node (or, for a rule of constants, one constant): its
    Rewrite, or why not (`reason`)."""

    graph: str
    node: onnx.NodeProto | None
    rewrite: Rewrite | None = None
    reason: str = ""
    constant: str = ""  # the constant's name, for a rule of constants (`node`: its Constant node, or None)

    @property
    def name(self) -> str:
        if self.constant:
            return self.constant
        return self.node.name or self.node.output[0]


Convert = Callable[[onnx.NodeProto, GraphView], "Rewrite | Refusal | None"]


def rewrite_model(model: onnx.ModelProto, convert: Convert, types, names: NameScope,
                  options: dict | None = None) -> list[Outcome]:
    """Ask `convert(node, view)` about every node of every scope of `model` (children first;
    None: not a node it takes; a Refusal: why it does not) and apply its rewrites to `model`,
    in place.  Returns what it said of each node it took, in the model's order.  `options`
    reach the rules through `view.options`."""
    walk = _Walk(model, types, names, dict(options or {}))
    said = {}
    for scope in reversed(walk.scopes):  # (pre-order reversed: every body before the graph holding it)
        said[id(scope)] = walk.rewrite(scope, convert)
    walk.finish()
    return [o for scope in walk.scopes for o in said[id(scope)]]  # (told in the model's order)


class _Walk:
    def __init__(self, model, types, names, options):
        self.model, self.types, self.names, self.options = model, types, names, options
        self.scopes = scopes(model)
        self.derived: dict[tuple, str] = {}  # (holder path, source, role, tensor bytes) -> the tensor's name
        self.made: dict[tuple[str, str], list[tuple[str, str]]] = {}  # (holder path, source) -> [(name, role)]
        self.holders: dict[str, Scope] = {s.path: s for s in self.scopes}
        self.candidates: set[str] = set()  # constants a rewrite stopped reading: removed at the end if unread
        self.replaced_domains: dict[int, set[str]] = {}  # id(top scope) -> the domains of nodes replaced there
        self.digests: dict[str, bytes] = {}  # new initializer -> its content's digest, where it was stored early
        self.nested_outputs: dict[int, set[str]] = {}  # id(scope) -> the outputs of the graphs nested in it (_let_go)

    # -- one scope ------------------------------------------------------------------------

    def rewrite(self, scope: Scope, convert: Convert) -> list[Outcome]:
        snapshot = list(scope.nodes)
        index = _Index(scope, snapshot)
        imports = scope_opsets(scope.imports)
        opset = ai_onnx_version(scope.imports) or 0
        if not opset and scope.in_function:  # (it gets the model's when a rewrite writes ai.onnx nodes into it)
            opset = ai_onnx_version(self.model.opset_import) or 0
        decoded = {}  # (a weight read twice while judging one node is decoded once; never kept longer)

        def constant(name):
            if name not in decoded:
                decoded[name] = _constant(scope, name)
            return decoded[name]

        view = GraphView(constant=constant, consumers=index.readers,
                         is_output=lambda name: name in index.outputs, spec=specs_at(self.types, scope),
                         names=self.names, producer=index.makers.get, imports=imports, in_function=scope.in_function,
                         options=self.options, raw=lambda name: _raw(scope, name))
        outcomes, applied, taken = [], [], set()
        for node in snapshot:
            if id(node) in taken:
                continue
            result = convert(node, view)
            decoded.clear()
            if result is None:
                continue
            if isinstance(result, Rewrite):
                refusal = self._refusal(result, scope, opset, taken)
                if refusal is None:
                    self._store_early(result)
                    applied.append(result)
                    taken.update(id(n) for n in result.replaces)
                    self._let_go(scope, index, result, taken)
                    outcomes.append(Outcome(scope.path, node, rewrite=result))
                    continue
                result = refusal
            outcomes.append(Outcome(scope.path, node, reason=str(result)))
        if applied:
            self._apply(scope, snapshot, applied)
        return outcomes

    def _store_early(self, rw: Rewrite) -> None:
        """Within external_constants, each new initializer written out as soon as its rewrite is
        taken (the scope's rewrites are applied together, at its end: held till then, they would
        be every weight's new form at once), its digest kept for `_place_constants`' sharing."""
        external = _EXTERNAL.get()
        if external is None:
            return
        for i, t in enumerate(rw.initializers):
            banded = external[4].pop(t.name, None)  # (written in bands by the rule already: its digest taken then)
            self.digests[t.name] = banded or _content(t)
            rw.initializers[i] = t if banded else external[1](t)

    def _let_go(self, scope: Scope, index: "_Index", rw: Rewrite, taken: set) -> None:
        """Within external_constants given a `let_go`, each constant of `scope` the nodes `rw` replaces
        read, once only nodes taken read it (here or in a body: a body's reader stands for its node),
        no new node of `rw` does, and no graph output names it, handed to `let_go`: `finish` removes
        it from the graph later, a rewrite reading it after would be a bug (the store says so)."""
        external = _EXTERNAL.get()
        if external is None or external[5] is None:
            return
        new_reads = {x for node in rw.nodes for n in with_nested(node) for x in n.input}
        outputs = self.nested_outputs.get(id(scope))
        if outputs is None:  # (the bodies are rewritten before their graph: their outputs are settled)
            outputs = self.nested_outputs[id(scope)] = {o for s in scopes_under(scope) for o in s.outputs}
        for name in dict.fromkeys(x for n in rw.replaces if not is_constant_node(n) for x in n.input if x):
            if name in new_reads or name in index.outputs or name in outputs or scope.resolve(name) is not scope:
                continue
            tensor = scope.constant(name)
            if tensor is not None and all(id(r) in taken for r in index.readers(name)):
                external[5](tensor)

    def _refusal(self, rw: Rewrite, scope: Scope, opset: int, taken: set) -> str | None:
        need = rw.domains.get("", 0)
        if need > opset:
            return (f"its rewrite needs ai.onnx opset {need} ({rw.needs_why or 'the ops it writes'}), and "
                    f"{'the function' if scope.in_function else 'the model'} imports {opset or 'none'}: raise it "
                    f"first (onnx.version_converter.convert_version(model, {need}))")
        if any(id(n) in taken for n in rw.replaces):
            return "another rewrite already takes one of the nodes it would replace"
        return None

    def _apply(self, scope: Scope, snapshot: list, rewrites: list[Rewrite]) -> None:
        position = {id(n): i for i, n in enumerate(snapshot)}
        gone, placed, constants = set(), {}, []
        for rw in rewrites:
            constants += self._place_constants(scope, rw)
            where = [position[id(n)] for n in rw.replaces]
            # (a Constant node it replaces stays until `finish`, which removes it if nothing reads it then:
            # the new nodes may read it still, a bias folded into MatMulNBits, a Gather's indices)
            gone.update(position[id(n)] for n in rw.replaces if not is_constant_node(n))
            placed.setdefault(max(where), []).extend(rw.nodes)  # after every input the replaced nodes read
            for n in rw.replaces:
                self.candidates.update(name for name in n.input if name)
                if is_constant_node(n):
                    self.candidates.add(n.output[0])
                self.replaced_domains.setdefault(id(scope.top), set()).add(n.domain)
            for domain, version in rw.domains.items():
                if domain not in ("", "ai.onnx"):
                    import_at_least(scope.imports, domain, version)
                elif ai_onnx_version(scope.imports) is None:
                    import_at_least(scope.imports, "", ai_onnx_version(self.model.opset_import))
        made = set()
        for i in sorted(gone | set(placed), reverse=True):  # (from the end: earlier positions stay put)
            if i in gone:
                del scope.nodes[i]
            for node in reversed(placed.get(i, [])):
                scope.nodes.insert(i, node)
                made.update(node.output)
        _insert_beside_sources(constants)  # (after the positions above were used)
        scope.changed()
        if scope.graph is not None:
            stale = {o for rw in rewrites for n in rw.replaces if not is_constant_node(n) for o in n.output} - made
            for vi in [vi for vi in scope.graph.value_info if vi.name in stale]:
                scope.graph.value_info.remove(vi)

    def _place_constants(self, scope: Scope, rw: Rewrite) -> list[tuple[Scope, onnx.TensorProto | onnx.NodeProto, str]]:
        """The rewrite's new constants, equal ones shared: (holder scope, initializer or Constant
        node, source) for each to add, in the scope that holds its source (in a function,
        constants are Constant nodes; beside a Constant node, one too)."""
        renamed, pending = {}, []
        for t in rw.initializers:
            source, role = rw.derived.get(t.name, (None, ""))
            holder = (scope.resolve(source) or scope) if source else scope
            key = (holder.path, source, role, self.digests.get(t.name) or _content(t)) if source else None
            if key is not None and key in self.derived:
                renamed[t.name] = self.derived[key]
                continue
            if key is not None:
                self.derived[key] = t.name
                self.made.setdefault((holder.path, source), []).append((t.name, role))
                self.candidates.add(source)
            as_node = holder.graph is None or holder.in_function or bool(source and holder.constant_node(source))
            external = _EXTERNAL.get()
            if external is not None and not as_node:
                t = external[1](t)
            pending.append((holder, _constant_node(t, self.names) if as_node else t, source or ""))
        if renamed:
            for node in rw.nodes:
                for n in with_nested(node):
                    n.input[:] = [renamed.get(name, name) for name in n.input]
        return pending

    # -- the whole model --------------------------------------------------------------------

    def finish(self) -> None:
        """Remove the constants no node reads any more, give each source's one derived
        tensor the source's name and place, and drop the imports no node uses any more."""
        read = _read_names(self.model)
        removed: dict[tuple[str, str], str] = {}  # (scope path, name) -> the Constant node's name ("" for an initializer)
        for scope in self.scopes:
            if scope.graph is not None:
                for i in reversed(range(len(scope.graph.initializer))):
                    name = scope.graph.initializer[i].name
                    if name in self.candidates and name not in read:
                        del scope.graph.initializer[i]
                        removed[(scope.path, name)] = ""
                for vi in [vi for vi in scope.graph.input if vi.name in self.candidates and vi.name not in read
                           and (scope.path, vi.name) in removed]:
                    scope.graph.input.remove(vi)  # (below IR 4 initializers are listed as inputs too)
            for i in reversed(range(len(scope.nodes))):
                node = scope.nodes[i]
                if is_constant_node(node) and node.output[0] in self.candidates and node.output[0] not in read:
                    removed[(scope.path, node.output[0])] = node.name
                    del scope.nodes[i]
        renames: dict[str, dict[str, tuple[str, str]]] = {}  # holder path -> {made: (source, its node's name)}
        for (path, source), made in self.made.items():
            main = [name for name, role in made if role == ""]
            if len(main) == 1 and (path, source) in removed:
                renames.setdefault(path, {})[main[0]] = (source, removed[(path, source)])
        for path, names in renames.items():
            holder = self.holders[path]
            inner = {name for s in scopes_under(holder) for name in s.defines()}  # (a rename there could be captured)
            _rename(holder, {made: to for made, to in names.items() if to[0] not in inner})
        for scope in self.scopes:
            if scope.top is scope:
                used = {n.domain for node in scope.nodes for n in with_nested(node)}
                gone = self.replaced_domains.get(id(scope), set()) - used - {"", "ai.onnx"}
                for domain in gone:
                    drop_opset(scope.imports, domain)


def _rename(holder: Scope, names: dict[str, tuple[str, str]]) -> None:
    """Call each constant `made` of `holder` (made beside its source, so in the source's place)
    by its source's name, in the scope and the bodies in it; a Constant node takes the source
    node's name too.  `names`: {made: (source, the source node's name)}."""
    if not names:
        return
    for node in holder.nodes:
        for n in with_nested(node):
            if any(x in names for x in n.input):
                n.input[:] = [names[x][0] if x in names else x for x in n.input]
        if is_constant_node(node) and node.output[0] in names:
            node.output[0], node.name = names[node.output[0]]
            node.attribute[0].t.name = node.output[0]
    if holder.graph is not None:
        for t in holder.graph.initializer:
            if t.name in names:
                t.name = names[t.name][0]
    holder.changed()


def _insert_beside_sources(pending) -> None:
    """Put each new constant right before its source (so that it stands in its place once the
    source is gone), or, without one, last (an initializer) or first (a Constant node)."""
    by_holder: dict[int, tuple[Scope, list]] = {}
    for holder, item, source in pending:
        by_holder.setdefault(id(holder), (holder, []))[1].append((item, source))
    for holder, items in by_holder.values():
        for kind in (onnx.TensorProto, onnx.NodeProto):
            mine = [(item, source) for item, source in items if isinstance(item, kind)]
            if not mine:
                continue
            field = holder.graph.initializer if kind is onnx.TensorProto else holder.nodes
            where = {x.name: i for i, x in enumerate(field)} if kind is onnx.TensorProto else \
                {x.output[0]: i for i, x in enumerate(field) if is_constant_node(x)}
            default = len(field) if kind is onnx.TensorProto else 0
            at = sorted(((where.get(source, default), n) for n, (_, source) in enumerate(mine)), reverse=True)
            for position, n in at:  # (from the end: earlier positions stay put; equal ones keep their order)
                field.insert(position, mine[n][0])
        holder.changed()


# -- reading a scope ------------------------------------------------------------------------

class _Index:
    """One scope's nodes, indexed for the converters' questions (nested readers stand for their node)."""

    def __init__(self, scope: Scope, nodes: list):
        self.makers, self._readers = {}, {}
        for node in nodes:
            for name in node.output:
                self.makers[name] = node
            for name in {name for reader in with_nested(node) for name in reader.input if name}:
                self._readers.setdefault(name, []).append(node)
        self.outputs = set(scope.outputs)

    def readers(self, name: str) -> list[onnx.NodeProto]:
        return list(self._readers.get(name, []))


def specs_at(types, scope: Scope) -> Callable[[str], TensorSpec | None]:
    """name -> its TensorSpec where `scope` reads it: the type ONNX infers, else (inside a
    function, where nothing is typed) the dtype and shape of the constant it names."""
    typed = types.specs_at(scope.path)

    def spec(name):
        found = typed(name)
        if found is not None or not name:
            return found
        holder = scope.resolve(name)
        tensor = holder.constant(name) if holder is not None else None
        return None if tensor is None else TensorSpec(dtype_name(tensor.data_type), tuple(tensor.dims))

    return spec


def _constant(scope: Scope, name: str):
    """The value of `name` where `scope` reads it, when the scope that defines it holds it as a
    constant (an initializer that is not also a graph input, or a Constant node's `value`)."""
    holder = scope.resolve(name)
    tensor = holder.constant(name) if holder is not None else None
    if tensor is None:
        return None
    external = _EXTERNAL.get()
    return numpy_helper.to_array(tensor) if external is None else external[0](tensor)


def _raw(scope: Scope, name: str):
    """The stored bytes of `name` where `scope` reads it, in place in its data file (GraphView.raw),
    or None."""
    external = _EXTERNAL.get()
    if external is None or external[2] is None:
        return None
    holder = scope.resolve(name)
    tensor = holder.constant(name) if holder is not None else None
    return None if tensor is None else external[2](tensor)


def _constant_node(t: onnx.TensorProto, names: NameScope) -> onnx.NodeProto:
    return onnx.helper.make_node("Constant", [], [t.name], name=names.fresh(f"{t.name}_Constant"), value=t)


def _content(t: onnx.TensorProto) -> bytes:
    """What makes two tensors equal, their names aside: a digest (the walker keeps one per derived
    tensor for the whole model: not the tensor's bytes) of its fields but the name and its raw
    data, hashed apart: the raw data read once (protobuf hands it out as a copy), never a copy of
    the whole tensor and its serialization beside it (docs/import.md, "Memory")."""
    from dyndq.plumbing.light import copy_fields

    header = onnx.TensorProto()
    copy_fields(t, header, skip={"name", "raw_data"})
    has_raw = t.HasField("raw_data")
    digest = _Digest(header, has_raw)
    if has_raw:
        digest.update(t.raw_data)
    return digest.digest()


class _Digest:
    """sha256 of a tensor's fields but its name and raw data (`header`, length first), whether it
    has raw data, then its raw data as given (`update`, in pieces)."""

    def __init__(self, header: onnx.TensorProto, has_raw: bool):
        fields = header.SerializeToString(deterministic=True)
        self._hash = hashlib.sha256(len(fields).to_bytes(8, "little") + fields + (b"\x01" if has_raw else b"\x00"))

    def update(self, data) -> None:
        self._hash.update(data)

    def digest(self) -> bytes:
        return self._hash.digest()


def _read_names(model: onnx.ModelProto) -> set[str]:
    """Every value some node, graph output or function output reads, anywhere in the model."""
    read = set()
    for scope in scopes(model):
        read.update(scope.outputs)
        for node in scope.nodes:
            read.update(node.input)
    return read


# -- rewriting constants (rules of kind QUANTIZE) -------------------------------------------

@dataclass(frozen=True)
class Held:
    """A constant offered to a rule of constants: an initializer of a graph, or a Constant
    node's value (`node`: that node).  `tensor`'s data may be elsewhere (a file): the rule
    reads it with `view.read(tensor)`, through the walker's store."""

    name: str
    scope: Scope
    tensor: onnx.TensorProto
    node: onnx.NodeProto | None = None


class Store:
    """Where the walker reads the values of the model's constants and puts the tensors it
    writes: by default the model itself.  A store that writes a file as it goes (the quantizer's
    `Tensors`) is given each initializer in the model's order: `put` for a new one (returns what
    stands for it in the graph: the tensor, or a stub pointing at the bytes written), `keep` for
    one left in place (a store writing a file copies its bytes there then)."""

    def array(self, tensor: onnx.TensorProto) -> np.ndarray:
        return numpy_helper.to_array(tensor)

    def put(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        return tensor

    def keep(self, tensor: onnx.TensorProto) -> None:
        return None


ConvertConstant = Callable[[Held, GraphView], "Rewrite | Refusal | None"]


def rewrite_constants(model: onnx.ModelProto, convert: ConvertConstant, names: NameScope,
                      store: Store | None = None, options: dict | None = None) -> list[Outcome]:
    """Ask `convert(held, view)` about every constant of every scope of `model` and apply its
    rewrites, in place; then `settle` the model.  Returns what it said of each constant it took.

    The constants come in the model's order (each scope in pre-order, the main graph first: its
    initializers in order, then its Constant nodes), so that a store writing the model's data
    file as it goes writes it in the order the model holds it, one weight at a time.  (No rewrite
    of a constant replaces an If/Loop/Scan node, so the order of `rewrite_model`, bodies first,
    is not needed here.)  A rewrite of a constant:
    - puts its new constants in the constant's place: before it among a graph's initializers
      (a Constant node's: last among them, where a Constant node of the graph's opset may not
      hold their type: int4 codes beside opset 11), through the store; in a function, which has
      no initializers, as Constant nodes first in it (each rewrite's before the ones placed so
      far; `settle` passes in from the main graph those the function's opset cannot hold);
    - puts its nodes, which read constants only, first in the scope holding the constant, in
      the order the constants came, and points the readers `rewires` names at them;
    - leaves the constant, and the nodes it `replaces` (the Identity nodes passing it on, its
      Constant node), once nothing else reads it, as ONNX resolves the name from each scope;
    - imports the domains its nodes need in the scope, and, for a function, in the model too.
    """
    return _ConstantWalk(model, names, store or Store(), dict(options or {})).run(convert)


def settle(model: onnx.ModelProto) -> None:
    """What a model whose functions got new constants and nodes of ours needs, in place: the
    constants a function's opset cannot hold passed in from the main graph (pass_out), our
    domain at one version in the model and its functions (align), the IR version its types need."""
    pass_out(model)
    align(model)
    model.ir_version = max(model.ir_version, model_ir(model))


class _ConstantWalk:
    def __init__(self, model, names, store, options):
        self.model, self.names, self.store, self.options = model, names, store, options
        self.scopes = scopes(model)
        self.gone: dict[int, onnx.NodeProto] = {}  # id -> a node leaving the model at the end
        self.first: dict[int, tuple[Scope, list]] = {}  # id(scope) -> (scope, the nodes put first in it)
        self._readers: dict[str, list[tuple[Scope, onnx.NodeProto]]] | None = None

    def run(self, convert: ConvertConstant) -> list[Outcome]:
        outcomes = []
        for scope in self.scopes:
            view = GraphView(constant=lambda name, scope=scope: self._value(scope, name), consumers=lambda name: [],
                             is_output=lambda name, scope=scope: name in scope.outputs, spec=lambda name: None,
                             names=self.names, imports=scope_opsets(scope.imports), in_function=scope.in_function,
                             options=self.options, read=self.store.array)
            if scope.graph is not None:
                outcomes += self._initializers(scope, view, convert)
            for node in list(scope.nodes):
                value = constant_value(node) if is_constant_node(node) else None
                if value is not None:
                    outcomes += self._offer(Held(node.output[0], scope, value, node), view, convert)
        for scope, nodes in self.first.values():
            for node in reversed(nodes):
                scope.nodes.insert(0, node)
        for scope in self.scopes:
            for i in reversed(range(len(scope.nodes))):
                if id(scope.nodes[i]) in self.gone:
                    del scope.nodes[i]
            scope.changed()
        if any(o.rewrite is not None for o in outcomes):
            settle(self.model)
        return outcomes

    def _initializers(self, scope: Scope, view: GraphView, convert) -> list[Outcome]:
        graph, outcomes, i = scope.graph, [], 0
        for tensor in list(graph.initializer):  # (i: its place now, the new ones before it counted)
            said = self._offer(Held(tensor.name, scope, tensor), view, convert, at=i)
            outcomes += said
            i += sum(len(o.rewrite.initializers) for o in said if o.rewrite is not None)
            if said and said[0].rewrite is not None and not self._read(scope, tensor.name):
                del graph.initializer[i]
                for vi in [vi for vi in graph.input if vi.name == tensor.name]:  # (IR < 4 lists it among the inputs)
                    graph.input.remove(vi)
                continue
            self.store.keep(tensor)
            i += 1
        return outcomes

    def _offer(self, held: Held, view: GraphView, convert, at: int | None = None) -> list[Outcome]:
        result = convert(held, view)
        if result is None:
            return []
        scope = held.scope
        if isinstance(result, Rewrite):
            need, opset = result.domains.get("", 0), ai_onnx_version(scope.imports) or 0
            if need > opset:
                result = Refusal(f"its rewrite needs ai.onnx opset {need} ({result.needs_why or 'the ops it writes'}), "
                                 f"and {'the function' if scope.in_function else 'the model'} imports {opset or 'none'}")
        if not isinstance(result, Rewrite):
            return [Outcome(scope.path, held.node, reason=str(result), constant=held.name)]
        self._apply(held, result, at)
        return [Outcome(scope.path, held.node, rewrite=result, constant=held.name)]

    def _apply(self, held: Held, rw: Rewrite, at: int | None) -> None:
        scope = held.scope
        nodes = []  # (in a function: its new constants as Constant nodes)
        for k, t in enumerate(rw.initializers):
            if scope.graph is None:
                nodes.append(onnx.helper.make_node("Constant", [], [t.name], value=t))
                continue
            place = len(scope.graph.initializer) if at is None else at + k
            scope.graph.initializer.insert(place, self.store.put(t))
            rw.initializers[k] = scope.graph.initializer[place]  # (what the graph holds: the Rewrite keeps no data)
        first = self.first.setdefault(id(scope), (scope, []))[1]
        first[:0] = nodes
        first.extend(rw.nodes)
        for node, index, value in rw.rewires:
            node.input[index] = value
        self.gone.update((id(n), n) for n in rw.replaces if not is_constant_node(n))
        if held.node is not None and any(n is held.node for n in rw.replaces) and not self._read(scope, held.name):
            self.gone[id(held.node)] = held.node
        for domain, version in rw.domains.items():
            if domain not in ("", "ai.onnx"):
                import_at_least(scope.top.imports, domain, version)
                if scope.in_function:
                    import_at_least(self.model.opset_import, domain, version)
        scope.changed()

    def _read(self, holder: Scope, name: str) -> bool:
        """Whether a node that stays, or an output, reads `name` where it resolves to `holder`'s."""
        if self._readers is None:
            self._readers = {}
            for scope in self.scopes:
                for node in scope.nodes:
                    for x in set(node.input):
                        self._readers.setdefault(x, []).append((scope, node))
        for scope, node in self._readers.get(name, ()):
            if id(node) not in self.gone and name in node.input and scope.resolve(name) is holder:
                return True
        return any(name in scope.outputs and scope.resolve(name) is holder for scope in [holder, *scopes_under(holder)])

    def _value(self, scope: Scope, name: str):
        holder = scope.resolve(name)
        tensor = holder.constant(name) if holder is not None else None
        return None if tensor is None else self.store.array(tensor)
