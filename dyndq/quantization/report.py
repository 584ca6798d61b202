"""What `quantize` did, for a person (`table`) and for tools (`as_dict`, the CLI's --json)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dyndq.opdefs import Problem
from dyndq.wording import plural, table

if TYPE_CHECKING:
    from dyndq.quantization.options import QuantizeOptions


@dataclass
class LayerReport:
    """One weight quantized."""

    name: str  # the initializer
    graph: str  # the graph holding it
    nodes: list[str]  # the nodes that read it quantized
    ops: list[str]
    shape: list[int]
    dtype: str
    form: str  # what stands for it: codes dtype, per_group/per_channel, padding, cast
    relative_error: float  # |W - W'| / |W|, Frobenius
    max_abs_error: float
    cosine: float
    bytes_before: int  # the float weight
    bytes_after: int  # codes (packed) + scales + zero points
    seconds: float
    notes: list[str] = field(default_factory=list)


@dataclass
class OutputDifference:
    """How far one graph output of the quantized model is from the float model's, same inputs."""

    name: str
    relative_error: float
    max_abs_error: float
    cosine: float


@dataclass
class QuantizeReport:
    options: QuantizeOptions  # as `quantize` judged them; `as_dict` writes them as "settings"
    layers: list[LayerReport] = field(default_factory=list)
    left_alone: list[Problem] = field(default_factory=list)  # weights of the chosen ops not quantized, and why
    outputs: list[OutputDifference] = field(default_factory=list)
    outputs_note: str = "not measured"  # how the output error was measured, or why it was not
    seconds: float = 0.0
    # the export to the form asked for (quantize_file's emit "onnx", "onnxruntime"): "written for
    # FORM: " its summary, then one line per node whose form it decided, and why (the weights left
    # in standard ONNX)
    emitted: list[str] = field(default_factory=list)
    data_file: str | None = None  # (quantize_file) the external data file written beside the model
    kept_files: list[str] = field(default_factory=list)  # (quantize_file onto its input) the input's data files, kept
    budget: object = None  # (a budget given) budget.BudgetReport: each weight's choice, and why

    @property
    def bytes_before(self) -> int:
        return sum(layer.bytes_before for layer in self.layers)

    @property
    def bytes_after(self) -> int:
        return sum(layer.bytes_after for layer in self.layers)

    @property
    def size_ratio(self) -> float:
        """Quantized weights (codes, scales, zero points) over the float weights they replace."""
        return self.bytes_after / self.bytes_before if self.bytes_before else 1.0

    def summary(self) -> str:
        o = self.options
        kind = f"{'int' if o.symmetric else 'uint'}{o.bits}"
        group = "per channel" if o.group_size == -1 else f"groups of {o.group_size}"
        alone = f"; {len(self.left_alone)} left alone" if self.left_alone else ""
        if o.budget is not None:
            return (f"quantized {plural(len(self.layers), 'weight')} to mixed formats ({', '.join(o.format_choices)}) "
                    f"within {o.budget:g} bits per weight{alone}")
        if o.format != "int":  # (the FP4 formats: their blocks and scales are the format's)
            return f"quantized {plural(len(self.layers), 'weight')} to {o.format} (blocks of {o.group_size}){alone}"
        return (f"quantized {plural(len(self.layers), 'weight')} to {kind} ({group}, "
                f"{'symmetric' if o.symmetric else 'asymmetric'}, {o.method}){alone}")

    def size_line(self) -> str:
        if self.budget is not None:
            return (f"weights: {_mib(self.bytes_before)} -> {_mib(self.bytes_after)} ({self.size_ratio:.3f}x; "
                    f"{self.budget.bits_per_weight:.4f} bits per weight, the budget {self.options.budget:g})")
        bits = self.options.bits
        return (f"weights: {_mib(self.bytes_before)} -> {_mib(self.bytes_after)} ({self.size_ratio:.3f}x; "
                f"the codes alone would be {bits}/32 = {bits / 32:.3f}x of float32)")

    def table(self) -> list[str]:
        """The report as lines: per layer, sizes, the output error, what was left alone."""
        rows = [[layer.name, "/".join(layer.ops), "x".join(map(str, layer.shape)), layer.form,
                 f"{layer.relative_error:.5f}", f"{layer.max_abs_error:.3g}", f"{layer.cosine:.6f}"]
                for layer in self.layers]
        lines = table(["weight", "op", "shape", "form", "rel. error", "max abs", "cosine"], rows, wrap=12)
        for layer in self.layers:
            lines += [f"  {layer.name}: {note}" for note in layer.notes]
        lines.append(f"  {self.size_line()}")
        if self.budget is not None:
            lines += [f"  {line}" for line in self.budget.lines()]
        lines.append(f"  output error ({self.outputs_note}):" if self.outputs else f"  output error: {self.outputs_note}")
        lines += [f"    {o.name}: rel. error {o.relative_error:.5f}, max abs {o.max_abs_error:.3g}, cosine {o.cosine:.6f}"
                  for o in self.outputs]
        if self.emitted:
            lines.append(f"  {self.emitted[0]}")
            lines += [f"    {line}" for line in self.emitted[1:]]
        if self.left_alone:
            lines.append(f"  left alone: {plural(len(self.left_alone), 'weight')}")
            lines += [f"    - {p}" for p in self.left_alone]
        return lines

    def as_dict(self) -> dict:
        return {
            "settings": self.options.settings(),
            "layers": [dataclasses.asdict(layer) for layer in self.layers],
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "size_ratio": self.size_ratio,
            "outputs": [dataclasses.asdict(o) for o in self.outputs],
            "outputs_note": self.outputs_note,
            "left_alone": [p.as_dict() | {"message": str(p)} for p in self.left_alone],
            "emitted": self.emitted,
            "data_file": self.data_file,
            "kept_files": self.kept_files,
            "seconds": self.seconds,
            **({} if self.budget is None else {"budget": self.budget.as_dict()}),
        }


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"
