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
    task: str | None = None  # "logits" or "distribution": its last axis is one, and the next two are measured
    top1_agreement: float | None = None  # the share of rows whose top-1 answer (argmax of the last axis) is the same
    kl_divergence: float | None = None  # mean KL(float || quantized) of the rows' distributions, nats

    def line(self) -> str:
        text = f"{self.name}: rel. error {self.relative_error:.5f}, max abs {self.max_abs_error:.3g}, cosine {self.cosine:.6f}"
        if self.task:
            text += f"; as {self.task}: top-1 agreement {self.top1_agreement:.2%}, KL {self.kl_divergence:.3g}"
        return text


@dataclass
class QuantizeReport:
    options: QuantizeOptions  # as `quantize` judged them; `as_dict` writes them as "settings"
    layers: list[LayerReport] = field(default_factory=list)
    left_alone: list[Problem] = field(default_factory=list)  # weights of the chosen ops not quantized, and why
    activations: str | None = None  # how many nodes of those ops read an activation where a weight would be
    ranking: list[dict] = field(default_factory=list)  # (quantize --rank-methods) every method on the same inputs, best first
    ranking_note: str | None = None  # (quantize --rank-methods) why no method was ranked ("not ranked: ...")
    outputs: list[OutputDifference] = field(default_factory=list)
    outputs_note: str = "not measured"  # how the output error was measured, or why it was not
    inputs: dict | None = None  # the inputs it was measured on: source, seed, each sample's arrays (evaluate.py)
    seconds: float = 0.0
    # the export to the form asked for (quantize_file's emit "onnx", "onnxruntime"): "written for
    # FORM: " its summary, then one line per node whose form it decided, and why (the weights left
    # in standard ONNX)
    emitted: list[str] = field(default_factory=list)
    data_file: str | None = None  # (quantize_file) the external data file written beside the model
    kept_files: list[str] = field(default_factory=list)  # (quantize_file onto its input) the input's data files, kept
    budget: object = None  # (a budget given) budget.BudgetReport: each weight's choice, and why
    # every constant of the model (initializers and Constant values, every graph and function; codes packed), before
    # and after: the weights quantized and the rest (a Conv's weights, biases), as the files hold them
    model_bytes_before: int = 0
    model_bytes_after: int = 0
    other_weights: str | None = None  # nodes of other ops (Conv) that read a constant float weight, not quantized
    emit: str | None = None  # (quantize_file) the form written: "dyndq", "onnx", "onnxruntime", "onednn-json"
    notes: list[str] = field(default_factory=list)  # (quantize_file) how the file written was checked, where it says more

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
        alone = f"; {len(self.left_alone)} left alone" if self.left_alone else ""
        if o.budget is not None:
            return (f"quantized {plural(len(self.layers), 'weight')} to mixed formats ({', '.join(o.format_choices)}) "
                    f"within {o.budget:g} bits per weight{alone}")
        return f"quantized {plural(len(self.layers), 'weight')} to {o.fmt.describe(o)}{alone}"

    @property
    def model_ratio(self) -> float:
        """Every constant of the model after over before: what the weights left as they are weigh too."""
        return self.model_bytes_after / self.model_bytes_before if self.model_bytes_before else 1.0

    def size_line(self) -> str:
        head = f"weights quantized: {_mib(self.bytes_before)} -> {_mib(self.bytes_after)} ({self.size_ratio:.3f}x; "
        if self.budget is not None:
            return head + f"{self.budget.bits_per_weight:.4f} bits per weight, the budget {self.options.budget:g})"
        bits = self.options.bits
        return head + f"the codes alone would be {bits}/32 = {bits / 32:.3f}x of float32)"

    def model_size_line(self) -> str:
        """The whole model's constants, the weights left alone with them (a Conv's, biases)."""
        return (f"the whole model's constants (initializers and Constant nodes, quantized or not): "
                f"{_mib(self.model_bytes_before)} -> {_mib(self.model_bytes_after)} ({self.model_ratio:.3f}x)")

    def inputs_note(self) -> str | None:
        """What the output error is worth when measured on inputs made up for it (None: the user's, or none)."""
        if not self.outputs or (self.inputs or {}).get("source") != "seeded":
            return None
        return ("these inputs are made up (seeded random values, not data the model was made for): the figures "
                "say how far the quantized model strays from the float one on them, not how well it does its task "
                "(a top-1 agreement on made-up inputs can be far lower or higher than on real ones); measure on "
                "real inputs with --input NAME=FILE.npy or --inputs-dir DIR (inputs= in Python)")

    def engines_note(self) -> str | None:
        """Where the file written runs, when it holds our op (emit "dyndq"): not in ONNX Runtime as it is."""
        if self.emit != "dyndq":
            return None
        return ("the file holds org.dyndq::DynamicDequantize nodes, which ONNX Runtime and OpenVINO cannot load "
                "(neither has the op): dyndq runs it (dyndq run: the reference engine with dyndq's kernel; "
                "--engine onnxruntime exports it on the way); for a file ONNX Runtime loads write --emit onnxruntime "
                "(MatMulNBits where exact) or --emit onnx (standard ONNX), or dyndq export OUT FILE --target "
                "onnxruntime (openvino for OpenVINO)")

    def table(self) -> list[str]:
        """The report as lines: per layer, sizes, the output error, what was left alone."""
        rows = [[layer.name, "/".join(layer.ops), "x".join(map(str, layer.shape)), layer.form,
                 f"{layer.relative_error:.5f}", f"{layer.max_abs_error:.3g}", f"{layer.cosine:.6f}"]
                for layer in self.layers]
        lines = table(["weight", "op", "shape", "form", "rel. error", "max abs", "cosine"], rows, wrap=12)
        for layer in self.layers:
            lines += [f"  {layer.name}: {note}" for note in layer.notes]
        lines.append(f"  {self.size_line()}")
        lines.append(f"  {self.model_size_line()}")
        if self.budget is not None:
            lines += [f"  {line}" for line in self.budget.lines()]
        lines.append(f"  output error ({self.outputs_note}):" if self.outputs else f"  output error: {self.outputs_note}")
        lines += [f"    {o.line()}" for o in self.outputs]
        if self.outputs:
            lines.append(f"  task score: {self.task_score_line()}")
        if self.inputs_note():
            lines.append(f"  note: {self.inputs_note()}")
        if self.engines_note():
            lines.append(f"  where it runs: {self.engines_note()}")
        if self.emitted:
            lines.append(f"  {self.emitted[0]}")
            lines += [f"    {line}" for line in self.emitted[1:]]
        if self.ranking:
            lines.append(f"  methods ranked on the same inputs, best first ({self.ranking[0]['inputs']}):")
            lines += [f"    {i}. {row['method']}: {row['score']}" for i, row in enumerate(self.ranking, 1)]
        elif self.ranking_note:
            lines.append(f"  methods: {self.ranking_note}")
        if self.activations:
            lines.append(f"  not weights: {self.activations}")
        if self.other_weights:
            lines.append(f"  not quantized: {self.other_weights}")
        if self.left_alone:
            lines.append(f"  left alone: {plural(len(self.left_alone), 'weight')}")
            lines += [f"    - {p}" for p in self.left_alone]
        lines += [f"  note: {note}" for note in self.notes]
        return lines

    def task_score(self) -> tuple:
        """What a task would see, as a key that sorts better runs first (the same model quantized
        by several methods or settings, on the same inputs): with outputs of logits or
        distributions, their mean KL divergence (lower first), then their mean top-1 agreement
        (higher first); else the mean relative error of the outputs.  () when nothing was
        measured.  KL leads: on a few dozen rows the top-1 agreement moves by whole rows, the
        KL divergence by how far each answer's distribution moved."""
        tasks = [o for o in self.outputs if o.task]
        if tasks:
            return (sum(o.kl_divergence for o in tasks) / len(tasks), -sum(o.top1_agreement for o in tasks) / len(tasks))
        if self.outputs:
            return (sum(o.relative_error for o in self.outputs) / len(self.outputs),)
        return ()

    def task_score_line(self) -> str:
        score = self.task_score()
        if len(score) == 2:
            return f"KL {score[0]:.3g}, top-1 agreement {-score[1]:.2%} (mean over the outputs of logits or distributions)"
        return f"rel. error {score[0]:.5f} (mean over the outputs; none is logits or a distribution)" if score else "none"

    def as_dict(self) -> dict:
        return {
            "settings": self.options.settings(),
            "layers": [dataclasses.asdict(layer) for layer in self.layers],
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "size_ratio": self.size_ratio,
            "model_bytes_before": self.model_bytes_before,
            "model_bytes_after": self.model_bytes_after,
            "model_ratio": self.model_ratio,
            "outputs": [dataclasses.asdict(o) for o in self.outputs],
            "outputs_note": self.outputs_note,
            "inputs": self.inputs,
            "inputs_note": self.inputs_note(),
            "task_score": list(self.task_score()),
            "left_alone": [p.as_dict() | {"message": str(p)} for p in self.left_alone],
            "activations": self.activations,
            "other_weights": self.other_weights,
            "ranking": self.ranking,
            "where_it_runs": self.engines_note(),
            **({} if self.ranking_note is None else {"ranking_note": self.ranking_note}),
            "emitted": self.emitted,
            "data_file": self.data_file,
            "kept_files": self.kept_files,
            "seconds": self.seconds,
            "notes": self.notes,
            **({} if self.budget is None else {"budget": self.budget.as_dict()}),
        }


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def ranking_rows(runs) -> list[dict]:
    """`rank_methods`' (method, report) pairs as the rows of `QuantizeReport.ranking`."""
    return [{"method": method, "score": r.task_score_line(), "task_score": list(r.task_score()), "inputs": r.outputs_note,
             "outputs": [dataclasses.asdict(o) for o in r.outputs]} for method, r in runs]


def write_report(report: QuantizeReport, path, extra: dict | None = None) -> str | None:
    """Write `report` to `path`: JSON for a .json file, Markdown for .md (atomically), and beside a
    Markdown one a per-weight error chart (PATH minus .md + "-errors.png") where matplotlib is
    installed.  Returns a note on the chart (written, or why not); ValueError for another suffix."""
    import json
    import os

    from dyndq.atomic_writes import write_atomically

    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".json", ".md"):
        raise ValueError(f"{path}: a report is written as .json or .md, not {suffix or 'a file without a suffix'}")
    doc = {**(extra or {}), **report.as_dict()}
    if suffix == ".json":
        text = json.dumps(doc, indent=2)
        write_atomically(path, lambda f: f.write(text.encode()))
        return None
    chart = os.path.splitext(path)[0] + "-errors.png"
    note = error_chart(report, chart)
    text = markdown(report, extra or {}, os.path.basename(chart) if note.startswith("wrote") else None)
    write_atomically(path, lambda f: f.write(text.encode()))
    return note


def markdown(report: QuantizeReport, extra: dict, chart: str | None) -> str:
    """The report as a Markdown page: settings, inputs, output metrics, the per-weight table."""
    lines = ["# dyndq quantize report", ""]
    lines += [f"- {k}: `{v}`" for k, v in extra.items()]
    lines += [f"- {report.summary()}", f"- {report.size_line()}", f"- {report.model_size_line()}"]
    lines += [f"- where it runs: {report.engines_note()}"] if report.engines_note() else []
    lines += [f"- time: {report.seconds:.2f} s", "", "## Settings", "",
              "| setting | value |", "|---|---|"]
    lines += [f"| {k} | `{v}` |" for k, v in report.options.settings().items()]
    lines += ["", "## Output metrics", "", f"Inputs: {report.outputs_note}", ""]
    if report.inputs_note():
        lines += [f"Note: {report.inputs_note()}.", ""]
    if report.outputs:
        lines += ["| output | rel. error | max abs | cosine | task | top-1 agreement | KL divergence |", "|---|---|---|---|---|---|---|"]
        for o in report.outputs:
            task = [o.task, f"{o.top1_agreement:.2%}", f"{o.kl_divergence:.4g}"] if o.task else ["", "", ""]
            lines.append(f"| {o.name} | {o.relative_error:.5f} | {o.max_abs_error:.3g} | {o.cosine:.6f} | " + " | ".join(task) + " |")
        lines += ["", f"Task score: {report.task_score_line()}"]
    lines += ["", "## Weights", "", "| weight | op | shape | form | rel. error | max abs | cosine | bytes before | bytes after |",
              "|---|---|---|---|---|---|---|---|---|"]
    for layer in report.layers:
        lines.append(f"| {layer.name} | {'/'.join(layer.ops)} | {'x'.join(map(str, layer.shape))} | {layer.form} | "
                     f"{layer.relative_error:.5f} | {layer.max_abs_error:.3g} | {layer.cosine:.6f} | {layer.bytes_before} | "
                     f"{layer.bytes_after} |")
    if chart:
        lines += ["", f"![relative error per weight]({chart})"]
    if report.budget is not None:
        lines += ["", "## Budget", ""] + budget_markdown(report.budget)
    if report.ranking:
        lines += ["", "## Methods ranked", "", f"On the same inputs ({report.ranking[0]['inputs']}), best first:", "",
                  "| rank | method | task score |", "|---|---|---|"]
        lines += [f"| {i} | {row['method']} | {row['score']} |" for i, row in enumerate(report.ranking, 1)]
    elif report.ranking_note:
        lines += ["", "## Methods ranked", "", report.ranking_note[0].upper() + report.ranking_note[1:] + "."]
    if report.activations:
        lines += ["", f"Not weights: {report.activations}."]
    if report.other_weights:
        lines += ["", f"Not quantized: {report.other_weights}."]
    if report.left_alone:
        lines += ["", "## Left alone", ""] + [f"- {p}" for p in report.left_alone]
    return "\n".join(lines) + "\n"


def budget_markdown(budget) -> list[str]:
    """A budget's allocation (budget.BudgetReport) as Markdown lines: what was spent, each weight's
    choice among its candidates and why, and the allocations run jointly."""
    d = budget.as_dict()
    lines = [f"Budget {d['budget']:g} bits per weight (codes, scales and zero points over the weights quantized), "
             f"chosen among {', '.join(d['choices'])}: {d['bits_per_weight']:.4f} spent ({d['bytes']} bytes over "
             f"{d['elements']} weights); kept: {d['kept']}.", "", f"Sensitivity: {d['sensitivity']}.", "",
             "| weight | chosen | why | candidates (bits per weight, output error) |", "|---|---|---|---|"]
    for w in d["weights"]:
        each = "; ".join(f"{c['choice']} {c['bits_per_weight']:.3f}, {c['output_error']:.3g}" for c in w["candidates"])
        lines.append(f"| {w['name']} | {w['chosen']} | {w['why']} | {each} |")
    if d["considered"]:
        lines += ["", "Allocations run jointly:", "", "| allocation | bytes | predicted | measured |", "|---|---|---|---|"]
        lines += [f"| {c['label']} | {c['bytes']} | {c['predicted']:.4g} | {c['measured']:.4g} |" for c in d["considered"]]
    return lines


def error_chart(report: QuantizeReport, path: str) -> str:
    """A bar chart of each weight's relative error as a PNG (written atomically); what was done, in
    words: "wrote PATH", or why no chart was drawn (matplotlib not installed, no weight).

    One horizontal bar a weight, in the report's order, its name beside it (cut in the middle past
    CHART_NAME characters) and the figure as tall as its rows need, so a model of hundreds of
    weights with long names keeps every label whole and readable; the bars are coloured by code
    type when the weights have more than one (a budget's mixed formats), with a legend."""
    try:
        import matplotlib  # noqa: F401  (whether it is installed: chart_figure draws with it)
    except ImportError:
        return "no error chart: matplotlib is not installed (pip install matplotlib draws one)"
    if not report.layers:
        return "no error chart: no weight was quantized"
    import io

    import matplotlib.pyplot as plt

    from dyndq.atomic_writes import write_atomically

    fig = chart_figure(report)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=CHART_DPI)
    plt.close(fig)
    write_atomically(path, lambda f: f.write(buffer.getvalue()))
    return f"wrote {path}"


CHART_DPI = 100


def chart_figure(report: QuantizeReport):
    """The error chart's matplotlib figure (`error_chart` draws it), for a report with weights."""
    import matplotlib

    matplotlib.use("Agg")  # (no display needed)
    import textwrap

    import matplotlib.pyplot as plt

    layers = report.layers
    names = [_short(layer.name) for layer in layers]
    kinds = [layer.form.split()[0] for layer in layers]  # the code type: uint4, int2, float4e2m1, ...
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {kind: palette[i % len(palette)] for i, kind in enumerate(dict.fromkeys(kinds))}
    width = 6.5 + 0.065 * max(len(name) for name in names)  # (inches: the plot, and the names beside it)
    fig, ax = plt.subplots(figsize=(width, 1.6 + 0.24 * len(layers)), layout="constrained")
    rows = range(len(layers))
    ax.barh(rows, [layer.relative_error for layer in layers], color=[colour[k] for k in kinds], height=0.7)
    ax.set_yticks(rows, names, fontsize=8)
    ax.invert_yaxis()  # (the first weight on top, as the report's table lists them)
    ax.set_ylim(len(layers) - 0.5, -0.5)
    ax.set_xlabel("relative error |W - W'| / |W| (Frobenius)")
    ax.grid(axis="x", linewidth=0.5, alpha=0.5)
    ax.set_axisbelow(True)
    if len(colour) > 1:
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=c, label=k) for k, c in colour.items()], title="codes", fontsize=8,
                  title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # (beside the plot, over no bar)
    ax.set_title("\n".join(textwrap.wrap(report.summary(), 90)), fontsize=9)
    return fig


CHART_NAME = 48  # characters of a weight's name the chart shows; a longer one keeps its two ends


def _short(name: str) -> str:
    if len(name) <= CHART_NAME:
        return name
    keep = CHART_NAME - 1
    return name[: keep // 2] + "\u2026" + name[-(keep - keep // 2):]
