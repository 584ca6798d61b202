"""Output by output: the quantized model against its float source on the same inputs, per engine.

The inputs are the user's or seeded samples, drawn as quantize's evaluation draws them
(`dyndq.quantization.evaluate`: the same checks, the same made-up inputs, said plainly).  Both
models run on each engine setting asked (settings.py: the reference engine, our kernel; ONNX
Runtime at its levels; OpenVINO) through `dyndq.run`'s Runner (`runner`: a model holding no op of
ours runs as given, so an ONNX Runtime quantizer's MatMulNBits runs with its own accuracy_level;
one holding ours as `dyndq.run` exports it, or as export's target "openvino"); per float output over every sample: the cosine, the
relative error ||q - f|| / ||f|| (summed as quantize's evaluation sums them:
`quantization.numerics.ErrorStats`), and, for logits or a distribution (`dyndq.task_metrics.
output_kind`, the one judge, on the float model's outputs), top-1 agreement and the mean KL(float
|| quantized) in nats.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from dyndq.quantization.numerics import ErrorStats
from dyndq.task_metrics import output_kind, row_sums


@dataclass
class OutputVerdict:
    engine: str
    setting: str
    name: str
    cosine: float
    relative: float
    top1: float | None = None
    kl: float | None = None

    def as_dict(self) -> dict:
        out = {"engine": self.engine, "setting": self.setting, "name": self.name, "cosine": self.cosine,
               "relative": self.relative}
        if self.top1 is not None:
            out.update(top1=self.top1, kl=self.kl)
        return out


def samples_for(model: onnx.ModelProto, inputs, seed: int, samples: int) -> tuple[list[dict], str]:
    """(the feeds, which they are in a few words): the user's, checked, or seeded ones."""
    from dyndq.quantization.evaluate import describe_samples, seeded_samples, user_inputs

    given = user_inputs(model, inputs)
    feeds = given if given is not None else seeded_samples(model, seed, samples)
    return feeds, describe_samples(feeds, given is not None, seed)


def compare(quantized: onnx.ModelProto, source: onnx.ModelProto, feeds: list[dict],
            settings) -> tuple[list[OutputVerdict], list[str], dict]:
    """(a verdict per float output and engine setting of `settings` (settings.EngineSetting), a note
    per setting that could not run a model, {setting: (the source's runs, the quantized model's)})."""
    from dyndq.wording import first_line

    out, ran = [], {}
    pairs, notes = paired(quantized, source)
    for setting in settings:
        runs = []
        for model, which in ((source, "the source"), (quantized, "the quantized model")):
            try:
                run = runner(model, setting)
                runs.append([run(f) for f in feeds])
            except Exception as e:  # (an engine without a kernel for a node, a feed refused: said, not raised)
                notes.append(f"{setting}: not compared: {which} does not run there: {first_line(e)}")
                break
        if len(runs) < 2:
            continue
        ran[setting] = floats, ours = runs
        for name in floats[0]:
            f = [np.asarray(s[name]) for s in floats]
            if pairs.get(name) not in ours[0] or not all(floating(a) for a in f):
                continue
            q = [np.asarray(s[pairs[name]]) for s in ours]
            stats = ErrorStats()  # (quantize's evaluation's sums: one judge of an output's error)
            with np.errstate(all="ignore"):
                for x, y in zip(f, q):
                    stats.add(x.reshape(-1), y.reshape(-1))
            verdict = OutputVerdict(setting.engine, setting.setting, name, stats.cosine, stats.relative)
            kind = output_kind(source, name, f)
            if kind is not None:
                agree = rows = 0
                kl = 0.0
                for x, y in zip(f, q):
                    a1, r1, k1 = row_sums(x, y, kind)
                    agree, rows, kl = agree + a1, rows + r1, kl + k1
                verdict.top1, verdict.kl = agree / rows, kl / rows
            out.append(verdict)
    return out, notes, ran


def paired(quantized: onnx.ModelProto, source: onnx.ModelProto) -> tuple[dict[str, str], list[str]]:
    """({the source's output: the quantized model's output compared with it}, notes).  By name; an
    output the quantized model renamed (Olive 0.13's RTN pass appends "_Q4" to a quantized MatMul's
    output, a graph output too) by its place among the graph's outputs, said; one with no
    counterpart said, not compared."""
    mine, theirs = [o.name for o in quantized.graph.output], [o.name for o in source.graph.output]
    pairs, notes = {}, []
    for i, name in enumerate(theirs):
        if name in mine:
            pairs[name] = name
        elif len(mine) == len(theirs) and mine[i] not in theirs:
            pairs[name] = mine[i]
            notes.append(f"the quantized model's output {mine[i]!r} is compared with the source's {name!r} "
                         "(the same place among the outputs; its name differs)")
        else:
            notes.append(f"the source's output {name!r} is not compared: the quantized model has no output of "
                         "that name")
    return pairs, notes


def engine_model(model: onnx.ModelProto, engine: str) -> onnx.ModelProto:
    """What `engine` runs of `model`: the model as given, or, where it holds an op of ours, its export
    (ONNX Runtime: the one `dyndq.run` runs; OpenVINO: export's target "openvino")."""
    from dyndq.opdefs import domains

    if not any(o.domain in domains() for o in model.opset_import):
        return model
    if engine == "onnxruntime":
        from dyndq.run_outputs import exported_for_onnxruntime

        return exported_for_onnxruntime(model)
    from dyndq.exporter import export

    return export(model, target=engine)


def runner(model: onnx.ModelProto, setting):
    """A `dyndq.runner.Runner` of `model` at `setting` (a settings.EngineSetting; feeds checked and outputs
    read as `dyndq.run` does)."""
    from dyndq.runner import Runner, session_class

    if setting.engine == "reference":
        return Runner(model, "reference")
    ran = engine_model(model, setting.engine)
    extra = {"level": setting.setting} if setting.engine == "onnxruntime" else {}
    return Runner(model, setting.engine, session=session_class(setting.engine)(ran, **extra))


def floating(a: np.ndarray) -> bool:
    """A float array, ml_dtypes' bfloat16 and float8 too (NumPy's kind of those is "V")."""
    from dyndq.opdefs import dtypes

    return a.dtype.name in {d.name for d in dtypes.DTYPES if d.is_float}
