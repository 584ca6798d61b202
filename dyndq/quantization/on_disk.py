"""`quantize_file(src, dst, emit=...)`: a model file quantized into another, in one of four forms.

- "dyndq": the DynamicDequantize-2 model itself.  From a model with external data the
  weights are read one at a time and the new tensors written to the new data file as they
  are made (the memory: about twice the largest weight, plus the model's structure).
- "onnx": lowered to standard ONNX by `dyndq.export` (DequantizeLinear-21, blocked).
- "onnxruntime": `dyndq.export(target="onnxruntime")`: MatMulNBits and GatherBlockQuantized
  where they express a node exactly (docs/int4-bridge.md), standard ONNX elsewhere.
- "onednn-json": a oneDNN graph (`dyndq.onednn.dump`, weights as inputs): its weights become
  input ports of property_type constant, their arrays .npy files in OUT's name + "-weights",
  written with the JSON all or nothing (`dyndq.onednn.save_json`, as `dyndq export-onednn
  --weights-as-inputs` writes them); `save_weights`, when given, is then called with
  {path: array} of the files written (the CLI says each).
The last three hold the quantized model in memory (about bits/32 of the float weights).
"""
from __future__ import annotations

import os

import onnx

from dyndq.plumbing.light import nbytes
from dyndq.opdefs import Problem
from dyndq.quantization.options import OptionError, QuantizeOptions
from dyndq.quantization.quantizer import Tensors, budget_feeds, quantize_model
from dyndq.quantization.report import QuantizeReport

EMITS = ("dyndq", "onnx", "onnxruntime", "onednn-json")
EVALUATE_BELOW = 1 << 31  # bytes of initializers: larger models are not run to measure the output error by default


def quantize_file(src, dst, *, emit: str = "dyndq", evaluate: bool | None = None, seed: int = 0, strict: bool = False,
                  progress=None, save_weights=None, inputs=None, samples: int = 4, **options) -> QuantizeReport:
    """Quantize the model in file `src` into file `dst` (options as `dyndq.quantize` takes them).
    evaluate: measure the output error (default: when the model's weights are under 2 GiB), on
    `inputs` or `samples` seeded samples as `dyndq.quantize` does."""
    from dyndq.quantization.evaluate import checked_samples, evaluate_into, user_inputs
    from dyndq.files import DataFile, read_model, save_model, staged_write

    if emit not in EMITS:
        raise OptionError([Problem("emit", repr(emit), ", ".join(EMITS))])
    loaded = read_model(src, load_data=False)
    checked = QuantizeOptions.checked(loaded.model, seed=seed, **options)
    samples = checked_samples(samples)
    too_big = sum(nbytes(t) for t in loaded.model.graph.initializer) >= EVALUATE_BELOW
    measure = not too_big if evaluate is None else evaluate
    # (a feed that does not fit: said before any work; a budget is chosen on them too)
    feeds = user_inputs(loaded.model, inputs) if measure or checked.budget is not None else None
    chosen_on = budget_feeds(loaded.model, checked, feeds, samples)
    out = None
    written = None  # the external data file written
    if emit == "dyndq" and loaded.external_data:
        with staged_write(dst, external_data=True) as stage:
            written = stage.location
            with open(os.path.join(stage.folder, stage.location), "wb") as f:
                quantized, report = quantize_model(loaded.model, checked, Tensors(loaded, DataFile(f, stage.location)),
                                                   strict=strict, progress=progress, feeds=chosen_on)
            onnx.save_model(quantized, stage.model)
            del quantized
    else:
        out, report = quantize_model(loaded.model, checked, Tensors(loaded), strict=strict, progress=progress,
                                     feeds=chosen_on)
        if emit == "onednn-json":
            from dyndq.onednn import save_json

            doc, weights = onednn_graph(out)
            files = save_json(doc, dst, weights)  # (the JSON and its -weights folder, all or nothing)
            if save_weights is not None:
                save_weights(files)
        elif emit == "dyndq":
            written = save_model(out, dst, external_data=loaded.external_data)
        else:
            lowered, exported = _lowered(out, emit)
            report.emitted = [f"written for {emit}: {exported.summary()}", *exported.lines()]
            written = save_model(lowered, dst, external_data=loaded.external_data)
            del lowered
    report.data_file, report.emit = written, emit
    if os.path.realpath(dst) == os.path.realpath(src):  # (the model replaced: its data files stay, see files.py)
        report.kept_files = [location for location in loaded.locations if location != written]
    if measure:
        from dyndq.files import load_model

        if out is None:
            out = load_model(dst)  # (the quantized model: about bits/32 of the float weights)
        # the float model's weights read from its data file for its run, never the whole model loaded
        # (but for external data outside the main graph's initializers, which only a load resolves)
        apart = loaded.external_data and _data_in_initializers_only(loaded.model)
        whole = loaded.model if apart or not loaded.external_data else load_model(src)
        evaluate_into(report, whole, out, seed=checked.seed, inputs=feeds, samples=samples, progress=progress,
                      loaded=loaded if apart else None)
    else:
        report.outputs_note = ("not measured (the model's weights are 2 GiB or more)" if evaluate is None
                               else "not measured (evaluate=False)")
    return report


def _data_in_initializers_only(model: onnx.ModelProto) -> bool:
    from onnx import external_data_helper as h

    main = sum(h.uses_external_data(t) for t in model.graph.initializer)
    return main == sum(h.uses_external_data(t) for t in h._get_all_tensors(model))


def _lowered(model: onnx.ModelProto, emit: str):
    """(the DynamicDequantize model exported to the form asked for, the export's report)."""
    from dyndq.exporter import export_with_report

    return export_with_report(model, target="onnxruntime" if emit == "onnxruntime" else "onnx")


def onednn_graph(model: onnx.ModelProto) -> tuple[dict, dict]:
    """(oneDNN graph JSON, {port name: array}) of a quantized model: its weights are input ports
    of property_type constant (oneDNN's graph JSON holds no tensor data), their values the arrays."""
    from dyndq.onednn import dump

    weights: dict = {}
    return dump(model, weights_as_inputs=True, weights=weights), weights
