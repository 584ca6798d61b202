"""What `runtime_parity` found, as text and as JSON (`as_dict`, the shape `dyndq check
--runtime-parity --json` prints)."""
from __future__ import annotations

from dataclasses import dataclass, field

from dyndq.parity.engines import Setting
from dyndq.parity.metrics import TOLERANCE, OutputParity


@dataclass(frozen=True)
class Cause:
    kind: str  # "transformer" (ONNX Runtime) | "accuracy_level" (a MatMulNBits node's) | "setting" (OpenVINO)
    name: str
    what: str

    def as_dict(self) -> dict:
        return {"kind": self.kind, "name": self.name, "what": self.what}


@dataclass(frozen=True)
class FirstDivergence:
    """The first node, in graph order, whose output differs beyond the tolerance."""

    node: str
    op_type: str
    output: str
    inputs: tuple[str, ...]
    became: str | None  # the node type the engine ran in its place (None: the engine's own graph is not known)
    parity: OutputParity

    def as_dict(self) -> dict:
        return {"node": self.node, "op_type": self.op_type, "output": self.output, "inputs": list(self.inputs),
                "became": self.became, "relative": self.parity.as_dict()["relative"]}

    def __str__(self) -> str:
        became = f", run as {self.became}" if self.became and self.became != self.op_type else ""
        return (f"first divergence: node {self.node!r} ({self.op_type}, inputs {', '.join(self.inputs)}){became}: "
                f"output {self.output!r} {self.parity.relative:.2g} of max |b|")


@dataclass
class Comparison:
    setting: Setting
    outputs: list[OutputParity] = field(default_factory=list)
    causes: list[Cause] = field(default_factory=list)
    first_divergence: FirstDivergence | None = None
    notes: list[str] = field(default_factory=list)  # what the search found or could not find
    error: str | None = None  # the engine could not run the model
    seconds: float = 0.0  # the session it compares (made and run)
    bisection: dict | None = None  # {"sessions": runs the search took, "over": how many switches}

    @property
    def agrees(self) -> bool:
        return self.error is None and all(o.agrees for o in self.outputs)

    def as_dict(self) -> dict:
        out = {"engine": self.setting.engine, "setting": self.setting.name, "export": self.setting.export,
               "agrees": self.agrees, "outputs": [o.as_dict() for o in self.outputs],
               "causes": [c.as_dict() for c in self.causes],
               "first_divergence": self.first_divergence.as_dict() if self.first_divergence else None}
        if self.bisection is not None:
            out["bisection"] = self.bisection
        if self.notes:
            out["notes"] = self.notes
        if self.error is not None:
            out["error"] = self.error
        return out

    def lines(self) -> list[str]:
        if self.error is not None:
            return [f"{self.setting}: cannot run: {self.error}"]
        head = f"{self.setting}: {'agrees' if self.agrees else 'differs'}"
        if self.agrees:
            return [head]
        out = [head] + [f"  {o}" for o in self.outputs]
        out += [f"  cause: {c.kind} {c.name}: {c.what}" for c in self.causes]
        if self.bisection is not None:
            what = "transformers" if self.setting.engine == "onnxruntime" else "settings"
            out.append(f"  (found in {self.bisection['sessions']} sessions over {self.bisection['over']} {what})")
        if self.first_divergence is not None:
            out.append(f"  {self.first_divergence}")
        out += [f"  note: {n}" for n in self.notes]
        return out


@dataclass
class ParityReport:
    model: str
    reference: str  # what the comparisons are against
    inputs: list[dict] = field(default_factory=list)  # {"name", "dtype", "shape", "given"}
    comparisons: list[Comparison] = field(default_factory=list)
    versions: dict = field(default_factory=dict)  # engine -> version
    cost: dict = field(default_factory=dict)  # seconds and sessions, see runtime_parity

    @property
    def agrees(self) -> bool:
        return all(c.agrees for c in self.comparisons)

    @property
    def differing(self) -> list[Comparison]:
        return [c for c in self.comparisons if not c.agrees]

    def as_dict(self) -> dict:
        return {"model": self.model, "reference": self.reference, "tolerance": TOLERANCE, "inputs": self.inputs,
                "versions": self.versions, "agrees": self.agrees,
                "comparisons": [c.as_dict() for c in self.comparisons], "cost": self.cost}

    def summary(self) -> str:
        rule = f"max |a - b| <= {TOLERANCE:g} * max |b|"
        n, bad = len(self.comparisons), len(self.differing)
        failed = sum(c.error is not None for c in self.comparisons)
        verdict = (f"every engine setting ({n}) agrees" if not bad else f"{bad} of {n} engine settings differ")
        # a setting that cannot run counts as differing (exit 1), and the summary says how many those are
        return f"{verdict} with {self.reference} ({rule})" + (f"; {failed} of them cannot run" if failed else "")

    def lines(self) -> list[str]:
        given = [f"{i['name']} {i['dtype']}{i['shape']} ({'given' if i['given'] else 'example'})" for i in self.inputs]
        out = [f"inputs: {', '.join(given) if given else 'none'}"]
        for c in self.comparisons:
            out += c.lines()
        return out
