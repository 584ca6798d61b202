"""Which weight is to blame: for each quantized weight matched to a float source weight, the
outputs of the float source with only that weight as the quantized model holds it, against the
float source's own, on the same feeds.

The measure is the budget's sensitivity (`quantization.swapped.Swapped`: the weights made graph
inputs, one session, each run feeding one weight swapped and the rest float), summed per output
by `quantization.numerics.ErrorStats` (the one judge of an output's error verify's outputs use).
It runs on ONNX Runtime (as the budget does: one session serves every swap), or on the reference
engine when ONNX Runtime cannot run the source.  Cost: one run of the float source per weight
and sample; its float outputs are verify's own (outputs.compare ran the source on the same feeds
at the same setting), so they are not computed again.

Ranked by relative error, largest first (a NaN first of all); `share` is the weight's squared
relative error on that output over the sum of every weight's (independent errors add in square,
to first order: so shares near 1 say one weight moved the output alone).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from dyndq.quantization.numerics import ErrorStats
from dyndq.quantization.swapped import Swapped, held, is_float_output

TOP = 10  # entries kept by default: the ranking's head says which layer; the rest is cost to read
ENGINES = ("onnxruntime", "reference")
SAID = {"onnxruntime": "ONNX Runtime", "reference": "the reference engine (our kernel)"}


@dataclass
class Blame:
    weight: str  # the name QUANTIZED holds (as the weights' verdict names it)
    source: str
    status: str  # the weight's verdict ("layout nibble-order" in the text; kind apart in JSON)
    kind: str | None
    output: str  # the output it moves most
    relative: float  # ||q - f|| / ||f|| of that output over every sample, only this weight swapped
    cosine: float
    share: float | None = None
    read_by: str | None = None  # the source's node reading it (an exporter's "/layer.3/.../value/MatMul")

    def as_dict(self) -> dict:
        out = {"weight": self.weight, "source": self.source, "status": self.status, "output": self.output,
               "relative": self.relative, "cosine": self.cosine}
        for key in ("kind", "read_by"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.share is not None:
            out["share"] = self.share
        return out

    def line(self) -> str:
        status = f"{self.status} {self.kind}" if self.kind else self.status
        share = f"  share {self.share:.3f}" if self.share is not None else ""
        read = f" read by {self.read_by}" if self.read_by else ""
        return (f"{self.weight} <- {self.source}{read} ({status}): {self.output} relative {self.relative:.3g}  "
                f"cosine {self.cosine:.6f}{share}")


def blamed(source: onnx.ModelProto, source_values, verdicts, feeds: list[dict],
           top: int | None = TOP, ran: dict | None = None) -> tuple[list[Blame], str]:
    """(the `top` weights most to blame, largest error first; None: all, how it was measured).
    `source_values(name)`: a source weight's float value in its own type; `verdicts`: the weights'
    (weights.WeightVerdict, each with `decoded`); `ran`: {engine: the float source's outputs per
    feed} already computed on that engine as `Swapped` runs it (verify's outputs: ONNX Runtime at
    its basic level, the reference engine), taken instead of running the source again."""
    from dyndq.wording import first_line

    swappable = held(source)
    differ = [v for v in verdicts if v.source is not None and v.decoded is not None and v.error != 0.0]
    chosen = [v for v in differ if v.source in swappable]
    skipped = [f"{v.weight} (its source tensor is not a weight of the main graph)" for v in differ if v not in chosen]
    if not chosen:
        return [], ("not measured: " + ", ".join(skipped)) if skipped else \
            "no weight differs from its source tensor: none to blame"
    floats = {v.source: source_values(v.source) for v in chosen}
    said = []
    for engine in ENGINES:
        try:
            run = Swapped(source, floats, engine)
            want = (ran or {}).get(engine) or [run(f) for f in feeds]
            break
        except Exception as e:  # (an engine that cannot run the source: the next one, said)
            said.append(f"{SAID[engine]} cannot run the source: {first_line(e)}")
    else:
        return [], "not measured: " + "; ".join(said)
    names = [n for n, v in want[0].items() if all(is_float_output(w[n]) for w in want)]
    if not names:
        return [], "not measured: the source has no finite float output to compare"
    per_weight: list[tuple[object, dict[str, ErrorStats]]] = []
    for v in chosen:
        f = floats[v.source]
        value = np.asarray(v.decoded())
        if value.shape != f.shape:
            skipped.append(f"{v.weight} (shape {list(value.shape)}, the source's {list(f.shape)})")
            continue
        stats = {n: ErrorStats() for n in names}
        for feed, w in zip(feeds, want):
            got = run(feed, {v.source: value.astype(f.dtype)})
            with np.errstate(all="ignore"):
                for n in names:
                    stats[n].add(np.asarray(w[n]).reshape(-1), np.asarray(got[n]).reshape(-1))
        per_weight.append((v, stats))
    readers: dict[str, list[str]] = {}
    for node in source.graph.node:
        for name in set(node.input):
            if node.name:
                readers.setdefault(name, []).append(node.name)
    squared = {n: sum(_squared(s[n].relative) for _, s in per_weight) for n in names}
    out = []
    for v, stats in per_weight:
        worst = max(names, key=lambda n: _rank(stats[n].relative))
        rel = stats[worst].relative
        share = _squared(rel) / squared[worst] if squared[worst] and np.isfinite(squared[worst]) else None
        out.append(Blame(v.weight, v.source, v.status, v.kind, worst, rel, stats[worst].cosine, share,
                         ", ".join(readers.get(v.source, [])) or None))
    out.sort(key=lambda b: -_rank(b.relative))
    how = (f"each of {len(per_weight)} weight(s) alone in the float source, on {SAID[engine]}, "
           f"{len(feeds)} sample(s)" + (f"; {'; '.join(said)}" if said else "")
           + (f"; not swapped: {', '.join(skipped)}" if skipped else "")
           + (f"; the {top} largest shown" if top is not None and len(out) > top else ""))
    return (out if top is None else out[:top]), how


def _rank(relative: float) -> float:
    return float("inf") if np.isnan(relative) else relative


def _squared(relative: float) -> float:
    return relative * relative if np.isfinite(relative) else 0.0
