"""`export(model)`: a copy of the model in standard ONNX, every DynamicDequantize lowered.

Every conversion is a rule of the one registry (converters/rules.py), applied through the
one walker: first what the target does (WRITE rules for a target with its own ops, LIFT
rules of the other engines' forms for "onnx"), then the opset is chosen, then the LOWER
rules in their passes.  This module chooses the opset and IR version and reports.

The whole model: the main graph, every If/Loop/Scan body (at any depth) and
every model-local function.  Each node of a registered domain is lowered by its
op version's `lowering` part; its `lowering_needs` part says which ai.onnx
opset and IR version that lowering needs.  The ai.onnx opset is kept when it is
high enough, otherwise raised to the lowest that works, the other nodes
converted by `onnx.version_converter`.  A domain leaves `opset_import` when
nothing uses it any more, and `ir_version` becomes the lowest the opsets, the
lowered nodes and the element types the model holds need (int4 needs IR 10).
"""
from __future__ import annotations

import dataclasses
import numbers
import os
from dataclasses import dataclass, field

import onnx

from dyndq.checker import check, value_types
from dyndq.converters.op_parts import attrs_of, input_specs
from dyndq.converters.walker import external_constants, specs_at, within_external_constants
from dyndq.converters.rules import LIFT, LOWER, TARGETS, WRITE, apply, foreign_forms, option_problems, passes, rules
from dyndq.model_files import model_of
from dyndq.function_attrs import functions_with_references, inline_referring_functions
from dyndq.held_tensors import HeldTensors, lent_copy
from dyndq.opdefs import DOMAIN, Needs, ValidationError, domains
from dyndq.plumbing.function_inputs import pass_out, take_in
from dyndq.plumbing.ir import model_ir
from dyndq.plumbing.names import NameScope, all_names
from dyndq.plumbing.opsets import ORT_MAX_OPSET, ai_onnx_version, drop_opset, set_opset
from dyndq.plumbing.walk import graphs, scopes, walk, with_nested

class ExportError(ValueError):
    """The model cannot be exported as asked (e.g. `opset=` below what the graph needs)."""


@dataclass(frozen=True)
class LoweredNode:
    graph: str  # where the node stood: "main", "main/if_node.then_branch", "function dom::Name"
    node: str  # its name (or its output's name when it had none)
    op: str  # "org.dyndq::DynamicDequantize-1"
    attrs: dict  # its attributes, defaults filled in
    form: str  # what the lowering chose (e.g. "DequantizeLinear", "integer arithmetic")
    nodes: int  # how many standard nodes replaced it
    why: str = ""  # why this form (target "onnxruntime": why not a contrib op)

    @property
    def qtype(self) -> str | None:
        return self.attrs.get("qtype")


@dataclass(frozen=True)
class ForeignNode:
    """A node that became, or was, one of ONNX Runtime's contrib ops, or a contrib node of the input."""

    graph: str
    node: str
    op: str  # what it was: "org.dyndq::DynamicDequantize-2", "com.microsoft::MatMulNBits"
    form: str  # what it is now
    why: str

    def __str__(self) -> str:
        return f"{self.graph}: {self.op} {self.node!r} -> {self.form}: {self.why}"


@dataclass
class ExportReport:
    """What `export` did: the nodes lowered, the opset and IR version written."""

    target: str = "onnx"
    lowered: list[LoweredNode] = field(default_factory=list)
    foreign: list[ForeignNode] = field(default_factory=list)  # contrib ops written, lifted or kept
    opset_before: int | None = None
    opset: int | None = None  # the ai.onnx opset written
    ir_version_before: int = 0
    ir_version: int = 0
    converted: bool = False  # whether onnx.version_converter ran
    domain_removed: bool = False

    @property
    def count(self) -> int:
        return len(self.lowered)

    def summary(self) -> str:
        opset = f"ai.onnx opset {self.opset}"
        if self.converted:
            opset += f" (converted from {self.opset_before})"
        ops = sorted({n.op.split("::")[-1].rsplit("-", 1)[0] for n in self.lowered}) or ["custom-domain"]
        text = f"lowered {self.count} {'/'.join(ops)} node(s); {opset}, IR version {self.ir_version}"
        written = [n for n in self.foreign if n.op.startswith(DOMAIN)]
        if written:
            kinds = "/".join(sorted({n.form.split(" (")[0].split("::")[-1] for n in written}))
            text = f"wrote {len(written)} {kinds} node(s); " + text
        taken = [n for n in self.foreign if not n.op.startswith(DOMAIN)]
        if taken:
            kinds = "/".join(sorted({n.op.split("::")[-1] for n in taken}))
            text += f"; {len(taken)} {kinds} node(s) in the input"
        return text

    def lines(self) -> list[str]:
        """One line per node whose form the target decided: each contrib node (written, lifted or
        kept) and, for target "onnxruntime", each DynamicDequantize lowered the standard way."""
        out = [str(n) for n in self.foreign]
        out += [f"{n.graph}: {n.op} {n.node!r} -> {n.form}: {n.why}" for n in self.lowered if n.why]
        return out


def export(model: onnx.ModelProto | str | os.PathLike, *, opset: int | None = None, target: str = "onnx",
           accuracy_level: int | None = None, own_ops: bool = True) -> onnx.ModelProto:
    """A copy of `model` for `target` ("onnx": standard ONNX, every DynamicDequantize lowered;
    "onnxruntime": MatMulNBits/GatherBlockQuantized where they express a node exactly, and
    standard forms ONNX Runtime's CPU runs for the rest; "openvino": standard forms OpenVINO's
    CPU runs; see the module doc).  own_ops=False: no engine's own op written, standard ONNX
    only, in the forms the target's engine runs.  Raises ValidationError for problems in the
    model, ExportError for a target, opset or accuracy_level it cannot write (each named), and
    TypeError for an opset that is not a whole number."""
    return export_with_report(model, opset=opset, target=target, accuracy_level=accuracy_level, own_ops=own_ops)[0]


def export_with_report(model: onnx.ModelProto | str | os.PathLike, *, opset: int | None = None, target: str = "onnx",
                       accuracy_level: int | None = None, own_ops: bool = True, consume: bool = False
                       ) -> tuple[onnx.ModelProto, ExportReport]:
    """`export`, and its report.  consume=True: the model given is the caller's own, made for the
    export and not used after it (the checkpoint import's): it is changed in place, not copied
    (a copy would hold every weight twice)."""
    if target not in TARGETS:
        raise ExportError(f"unknown target {target!r}; the targets are {', '.join(TARGETS)}")
    if (target == "onnxruntime" and isinstance(opset, numbers.Integral) and not isinstance(opset, bool)
            and opset > ORT_MAX_OPSET):  # (its kernels stop there: DequantizeLinear-28 has none in 1.32)
        raise ExportError(f"opset {opset} is newer than ONNX Runtime runs ({ORT_MAX_OPSET}); the target onnxruntime "
                          f"is written for it: an opset up to {ORT_MAX_OPSET}, or none")
    options = {"accuracy_level": accuracy_level}  # (each taken by the rules that declare it: converters/rules.py)
    problems = option_problems(options)
    if problems:
        raise ExportError("; ".join(problems))
    model = model_of(model, "export")
    problems = check(model)
    if problems:
        raise ValidationError(problems)

    if consume and isinstance(model, onnx.ModelProto):
        return _exported(model, opset, target, options, own_ops, model.ir_version)
    if model.functions or within_external_constants():  # (a function's constants are copies of the main graph's)
        out = onnx.ModelProto()
        out.CopyFrom(model)
        return _exported(out, opset, target, options, own_ops, model.ir_version)
    # the copy's weights lent, held beside it while the rules work (dyndq.held_tensors): each weight's
    # old form let go as its new one is made, and each tensor put into the model returned once
    held = HeldTensors()
    out = lent_copy(model, held)
    with external_constants(held.read, held.stored, held.raw, held.stored_bytes, held.let_go):
        out, report = _exported(out, opset, target, options, own_ops, model.ir_version)
    held.given_back(out)
    return out, report


def _exported(out: onnx.ModelProto, opset, target: str, options: dict, own_ops: bool, ir_before: int
              ) -> tuple[onnx.ModelProto, ExportReport]:
    """`export_with_report`'s work on `out`, the caller's own model (changed in place, or replaced by
    its opset's conversion)."""
    take_in(out)  # (a function's constants passed in from the main graph are its Constant nodes again, for the rules)
    out = _inlined(out)  # a node taking attributes by reference is lowered per call
    report = ExportReport(target=target, ir_version_before=ir_before)
    current = ai_onnx_version(out.opset_import)
    report.opset_before = current
    types = value_types(out)
    why_standard, lifted = _for_target(out, target if own_ops else "onnx", options, types, report)
    if lifted:  # (new nodes of ours to type; after a fusion the types before it still hold for what is left)
        types = value_types(out)
    where = {scope.path: scope for scope in scopes(out)}
    needs = [(site, _needs(site, specs_at(types, where[site.graph])).at(target)) for site in _our_sites(out)]
    written = _target_opset(opset, current, needs)  # the ai.onnx opset written
    report.opset = written

    if current is not None and written is not None and written != current:
        out = _convert(out, written)
        report.converted = True

    names = NameScope(all_names(out))
    if report.converted:
        types = value_types(out)

    if written is not None:
        set_opset(out.opset_import, "", written)
    for k, f in enumerate(out.functions):
        if _uses_domain_nodes(f.node, domains()) and ai_onnx_version(f.opset_import) not in (None, written):
            out.functions[k].CopyFrom(_convert_function(f, written))  # its lowered nodes are at `written`
    for chosen in passes(LOWER, target):  # (a padded DynamicDequantize + Slice joined first, then each node)
        for o in apply(out, chosen, types, names, {"opset": written, "target": target}):
            if o.rewrite is not None:
                op = o.rewrite.op
                report.lowered.append(LoweredNode(o.graph, o.name, f"{op.qualname}-{op.since_version}",
                                                  attrs_of(op, o.node), o.rewrite.form, len(o.rewrite.nodes)))
    for k, n in enumerate(report.lowered):
        if n.node in why_standard:
            report.lowered[k] = dataclasses.replace(n, why=why_standard[n.node])
        if n.node in lifted:  # a contrib node of the input: its form is what its DynamicDequantize became
            i, rest = lifted[n.node]
            report.foreign[i] = dataclasses.replace(report.foreign[i], form=" + ".join([n.form] + rest))
    for f in out.functions:
        for domain in domains():
            if not _uses_domain_nodes(f.node, {domain}):
                report.domain_removed |= drop_opset(f.opset_import, domain)

    for domain in domains():
        if not _model_uses_domain(out, domain):
            report.domain_removed |= drop_opset(out.opset_import, domain)
    pass_out(out)  # (what a function's opset does not hold as a Constant: plumbing/function_inputs.py)
    ir = max([model_ir(out)] + [n.ir_version for _, n in needs])
    out.ir_version = ir
    report.ir_version = ir
    return out, report


def _inlined(model: onnx.ModelProto) -> onnx.ModelProto:
    """`inline_referring_functions`, onnx.inliner's refusal told as an ExportError."""
    try:
        return inline_referring_functions(model)
    except RuntimeError as e:  # e.g. a function importing ai.onnx at another version than the model
        referring = ", ".join(f"{d}::{n}" for d, n in functions_with_references(model))
        raise ExportError(
            f"onnx.inliner could not inline the model-local functions whose nodes take attributes by "
            f"reference ({referring}): {e} (it needs the model and its functions to import each domain "
            f"at one version)") from e


# -- targets ------------------------------------------------------------------------------------

def _for_target(out: onnx.ModelProto, target: str, options: dict, types, report: ExportReport):
    """What the target does before the standard lowering, in place, by the rules that name it:
    a target with its own ops ("onnxruntime") writes them for the DynamicDequantize nodes they
    express (WRITE rules); "onnx" lifts the other engines' forms of the input (LIFT rules),
    which then lower as ours do.  Returns why each node a target with its own ops left
    standard stays so (by node name), and for "onnx" each lifted node's DynamicDequantize (by
    name) -> (its entry in report.foreign, the standard ops after it)."""
    names = NameScope(all_names(out))
    if rules(WRITE, target):
        return _write_target_ops(out, target, options, types, names, report), {}
    lifted: dict[str, tuple[int, list[str]]] = {}
    for o in apply(out, rules(LIFT, target), types, names, options):  # (the walker imports our domain where it writes it)
        op = f"{o.node.domain}::{o.node.op_type}"
        if o.rewrite is None:
            report.foreign.append(ForeignNode(o.graph, o.name, op, "kept", f"no standard form: {o.reason}"))
            continue
        ours = next(n for n in o.rewrite.nodes if n.domain == DOMAIN)
        rest = [n.op_type for n in o.rewrite.nodes if n.domain in ("", "ai.onnx") and n.op_type != "Constant"]
        lifted[ours.name] = (len(report.foreign), rest)
        report.foreign.append(ForeignNode(o.graph, o.name, op, o.rewrite.form, "target onnx: standard ONNX only"))
    return {}, lifted


def _write_target_ops(out, target: str, options: dict, types, names, report) -> dict[str, str]:
    forms = foreign_forms()
    for site in walk(out):
        if (site.node.domain, site.node.op_type) in forms:
            report.foreign.append(ForeignNode(site.graph, site.node.name or site.node.output[0],
                                              f"{site.node.domain}::{site.node.op_type}", "kept",
                                              "already ONNX Runtime's form"))
    why = {}
    for o in apply(out, rules(WRITE, target), types, names, options):
        if o.rewrite is None:
            why[o.name] = o.reason
            continue
        op = o.rewrite.op
        report.foreign.append(ForeignNode(o.graph, o.name, f"{op.qualname}-{op.since_version}", o.rewrite.form,
                                          "constant weights that op expresses exactly"))
    return why


# -- opsets -------------------------------------------------------------------------------------

def _needs(site, spec_of) -> Needs:
    """What the node's lowering needs, asked of its op version, with the specs its lowering will
    see (`spec_of`: the walker's, so that both agree; inside a function only constants have one,
    TensorSpec(None, None) for any other present input)."""
    op = site.op
    return op.lowering_needs(*input_specs(op, site.node, spec_of), **attrs_of(op, site.node))


def _who(site) -> str:
    node = site.node
    return f"{site.graph}: {node.op_type} {node.name or node.output[0]!r}"


def _target_opset(opset, current, needs) -> int | None:
    newest = onnx.defs.onnx_opset_version()
    need = max((n.opset for _, n in needs), default=0)
    if opset is not None:
        if isinstance(opset, bool) or not isinstance(opset, numbers.Integral):  # (np.int64 is fine)
            raise TypeError(f"opset must be an int, not {type(opset).__name__}")
        opset = int(opset)
        if opset < need:
            low = [f"{_who(site)} needs {n.opset} ({n.why})" for site, n in needs if n.opset > opset]
            raise ExportError(
                f"opset {opset} is too low for this graph: it needs ai.onnx opset >= {need}; "
                + "; ".join(low[:5]) + (f"; and {len(low) - 5} more" if len(low) > 5 else "")
            )
        if opset > newest:
            raise ExportError(f"opset {opset} is newer than this onnx knows ({newest})")
        return opset
    if current is None:
        return need or None
    if current > ORT_MAX_OPSET:  # newer than ONNX Runtime runs: convert down, by default
        return max(need, ORT_MAX_OPSET)
    return max(current, need)  # kept when high enough, else the lowest that works


def _convert(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """onnx.version_converter on the model; it skips our nodes (lowered afterwards at the
    target opset), drops model-local functions (converted here one by one) and adds
    inferred value_info (dropped again: the model keeps its own)."""
    functions = list(model.functions)
    kept = [{vi.name for vi in g.value_info} for g in graphs(model.graph)]
    try:
        converted = onnx.version_converter.convert_version(model, target)
    except Exception as e:  # noqa: BLE001 - the converter raises several kinds
        raise ExportError(
            f"onnx.version_converter could not convert the model from opset {ai_onnx_version(model.opset_import)} "
            f"to {target}: {e} (choose another target opset: opset= in Python, --opset on the command line)"
        ) from e
    # the converter returns new protos: match graphs by their position in the walk
    for g, names in zip(graphs(converted.graph), kept):
        extra = [vi for vi in g.value_info if vi.name not in names]
        for vi in extra:
            g.value_info.remove(vi)
    del converted.functions[:]
    converted.functions.extend(_convert_function(f, target) for f in functions)
    return converted


def _convert_function(f: onnx.FunctionProto, target: int) -> onnx.FunctionProto:
    version = ai_onnx_version(f.opset_import)
    if version is None or version == target:
        return f
    graph = onnx.helper.make_graph(
        list(f.node), f.name,
        [onnx.helper.make_empty_tensor_value_info(i) for i in f.input],
        [onnx.helper.make_empty_tensor_value_info(o) for o in f.output],
    )
    wrapper = onnx.helper.make_model(graph, opset_imports=list(f.opset_import))
    try:
        converted = onnx.version_converter.convert_version(wrapper, target)
    except Exception as e:  # noqa: BLE001
        raise ExportError(
            f"onnx.version_converter could not convert function {f.domain}::{f.name} to opset {target}: {e}"
        ) from e
    g = onnx.FunctionProto()
    g.CopyFrom(f)
    del g.node[:]
    g.node.extend(converted.graph.node)
    set_opset(g.opset_import, "", target)
    return g




# -- walking ------------------------------------------------------------------------------------

def _our_sites(model: onnx.ModelProto):
    """Every node of a registered domain, where it stands."""
    ours = domains()
    return [site for site in walk(model) if site.node.domain in ours]


def _uses_domain_nodes(nodes, ours) -> bool:
    return any(n.domain in ours for node in nodes for n in with_nested(node))


def _model_uses_domain(model: onnx.ModelProto, domain: str) -> bool:
    return any(site.node.domain == domain for site in walk(model)) or any(f.domain == domain for f in model.functions)
