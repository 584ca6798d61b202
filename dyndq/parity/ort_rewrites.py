"""ONNX Runtime's graph transformers, by the names `disabled_optimizers` takes, and what one did.

ONNX Runtime has no API listing its transformers; the names are those its sources give them
(onnxruntime/core/optimizer/graph_transformer_utils.cc, 1.32: each transformer's Name(), the
rewrite rules of its rule-based transformers by their own names), in the order it runs them,
by the level that adds them.  It accepts an unknown name silently, so a name wrong here is
harmless: the check only names a transformer after measuring that disabling it changes the
outcome (`bisect.culprits`), and says so when disabling all of them does not.
"""
from __future__ import annotations

import collections

import onnx

from dyndq.plumbing.names import op_name

BY_LEVEL = {
    "basic": (  # level 1: the rewrite rules first, then the transformers
        "EliminateIdentity", "EliminateSlice", "UnsqueezeElimination", "EliminateDropout", "ExpandElimination",
        "CastElimination", "PreShapeNodeElimination", "NoopElimination", "DivMulFusion", "FuseReluClip",
        "GemmSumFusion", "GemmTransposeFusion", "NotWhereFusion", "ConvAddFusion", "ConvMulFusion", "ConvBNFusion",
        "PadFusion", "MatmulBNFusion", "LabelEncoderFusion",
        "DoubleQDQPairsRemover", "ConstantSharing", "CommonSubexpressionElimination", "ConstantFolding",
        "MatMulAddFusion", "ReshapeFusion", "FreeDimensionOverrideTransformer", "GeluFusionL1",
        "LayerNormFusionL1", "QDQPropagationTransformer", "WeightBiasQuantization", "EnsureUniqueDQForNodeUnit",
        "TransposeOptimizer"),
    "extended": (  # level 2
        "ClipQuantRewrite", "ReluQuantRewrite", "QDQS8ToU8Transformer", "QDQSelectorActionTransformer",
        "GemmActivationFusion", "MatMulIntegerToFloatFusion", "DynamicQuantizeMatMulFusion", "ConvActivationFusion",
        "GeluFusionL2", "LayerNormFusionL2", "SimplifiedLayerNormFusion", "AttentionFusion", "EmbedLayerNormFusion",
        "GatherSliceToSplitFusion", "GatherToSliceFusion", "MatmulTransposeFusion", "BiasGeluFusion",
        "SkipLayerNormFusion", "FastGeluFusion", "QuickGeluFusion", "BiasSoftmaxFusion", "MatMulScaleFusion",
        "Avx2WeightS8ToU8Transformer", "MatMulNBitsFusion", "QDQFinalCleanupTransformer"),
    "all": ("NchwcTransformer", "NhwcTransformer", "ConvAddActivationFusion"),  # level 3: layouts
}
# Level 1's GeluFusion and LayerNormFusion take the level into their names ("GeluFusionL1", ...);
# ONNX Runtime versions before that named them plainly: both spellings are disabled.
_ALSO = {"GeluFusionL1": ("GeluFusion",), "GeluFusionL2": ("GeluFusion",),
         "LayerNormFusionL1": ("LayerNormFusion",), "LayerNormFusionL2": ("LayerNormFusion",)}

# What a transformer's rewrite is known to change in the arithmetic, and the session option that keeps it exact.
KNOWN = {
    "QDQSelectorActionTransformer": (
        "DequantizeLinear + MatMul fused into com.microsoft::MatMulNBits, whose accuracy_level 4 quantizes the "
        "activations to int8", ("session.qdq_matmulnbits_accuracy_level", "0")),
}


def accuracy_levels(model: onnx.ModelProto) -> dict[str, int]:
    """The main graph's com.microsoft::MatMulNBits nodes whose own accuracy_level attribute is above 0,
    by name (the first output's where the node has none): a setting the model carries, which every
    optimization level runs (4 quantizes the input A to int8 per block on a CPU with int8 dot products)."""
    out = {}
    for n in model.graph.node:
        if n.op_type == "MatMulNBits" and n.domain == "com.microsoft":
            level = next((a.i for a in n.attribute if a.name == "accuracy_level"), 0)
            if level > 0:
                out[n.name or n.output[0]] = level
    return out


def at_accuracy_0(model: onnx.ModelProto, nodes) -> onnx.ModelProto:
    """A copy of `model` whose MatMulNBits `nodes` (named as `accuracy_levels` names them) hold accuracy_level 0."""
    from onnx import helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    for n in out.graph.node:
        if n.op_type == "MatMulNBits" and (n.name or n.output[0]) in nodes:
            kept = [a for a in n.attribute if a.name != "accuracy_level"]
            del n.attribute[:]
            n.attribute.extend(kept + [helper.make_attribute("accuracy_level", 0)])
    return out


def transformers(level: str) -> list[str]:
    """The transformers and rules that run at `level` ("basic", "extended", "all"), in ONNX Runtime's order."""
    from dyndq.ort_session import LEVELS

    names = []
    for at in LEVELS[1:]:  # (every level but "off", in order)
        names += BY_LEVEL[at]
        if at == level:
            return names
    raise ValueError(f"unknown level {level!r}")


def disabled_names(names) -> tuple[str, ...]:
    """`names` with the other spellings ONNX Runtime versions gave them."""
    out = []
    for name in names:
        out += [name, *_ALSO.get(name, ())]
    return tuple(dict.fromkeys(out))


def node_types(graph: onnx.GraphProto) -> collections.Counter:
    return collections.Counter(op_name(n) for n in graph.node)


def changes(before: onnx.ModelProto, after: onnx.ModelProto) -> str:
    """The node types whose counts differ between two optimized graphs, "Op n -> m" each; a
    MatMulNBits count with the accuracy levels `after` gives them."""
    a, b = node_types(before.graph), node_types(after.graph)
    levels = sorted({attr.i for n in after.graph.node if n.op_type == "MatMulNBits"
                     for attr in n.attribute if attr.name == "accuracy_level"})
    parts = []
    for op in sorted(set(a) | set(b)):
        if a.get(op, 0) != b.get(op, 0):
            note = f" (accuracy_level {'/'.join(map(str, levels))})" if op.endswith("MatMulNBits") and levels else ""
            parts.append(f"{op} {a.get(op, 0)} -> {b.get(op, 0)}{note}")
    return ", ".join(parts) if parts else "no node type changed in count (attributes or arithmetic only)"
