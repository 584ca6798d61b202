"""`quantize_file(src, dst, emit=...)`: a model file quantized into another, in one of its forms (EMITS).

- "dyndq": the DynamicDequantize-2 model itself.  From a model with external data the
  weights are read one at a time and the new tensors written to the new data file as they
  are made (the memory: about twice the largest weight, plus the model's structure).
- each export target of the engine table (`dyndq.converters.engines`): `dyndq.export(target=...)`
  of it: "onnx", standard ONNX (DequantizeLinear-21, blocked); "onnxruntime", MatMulNBits and
  GatherBlockQuantized where they express a node exactly (docs/int4-bridge.md), standard ONNX
  elsewhere; "openvino", standard ONNX in the forms OpenVINO's CPU runs.
- "onednn-json": a oneDNN graph (`dyndq.onednn.dump`, weights as inputs): its weights become
  input ports of property_type constant, their arrays .npy files in OUT's name + "-weights",
  written with the JSON all or nothing (`dyndq.onednn.save_json`, as `dyndq export-onednn
  --weights-as-inputs` writes them); `save_weights`, when given, is then called with
  {path: array} of the files written (the CLI says each).
All but "dyndq" hold the quantized model in memory (about bits/32 of the float weights).
Every form is written to a staging place, checked there (`dyndq.written`: it loads on the engine
it is for), measured there as written (a model file on ONNX Runtime, the evaluation's engine), and
only then put in place: all or nothing.
"""
from __future__ import annotations

import os

import onnx

from dyndq.converters.engines import ENGINES as TABLE
from dyndq.converters.rules import TARGETS
from dyndq.plumbing.light import nbytes
from dyndq.opdefs import Problem
from dyndq.quantization.options import OptionError, QuantizeOptions
from dyndq.quantization.quantizer import Tensors, budget_feeds, quantize_model
from dyndq.quantization.report import QuantizeReport

EMITS = ("dyndq", *TARGETS, "onednn-json")  # ("dyndq", "onnx", "onnxruntime", "openvino", "onednn-json")
EVALUATE_BELOW = 1 << 31  # bytes of initializers: larger models are not run to measure the output error by default


def quantize_file(src, dst, *, emit: str = "dyndq", evaluate: bool | None = None, seed: int = 0, strict: bool = False,
                  progress=None, save_weights=None, inputs=None, samples: int = 4, overwrite: bool = False,
                  before_placing=None, **options) -> QuantizeReport:
    """Quantize the model in file `src` into file `dst` (options as `dyndq.quantize` takes them).
    evaluate: measure the output error (default: when the model's weights are under 2 GiB), on
    `inputs` or `samples` seeded samples as `dyndq.quantize` does.

    All or nothing: the output is written to a staging place beside `dst`, checked there
    (`dyndq.written.verify_model`: `dyndq check`, and it loads on the engine its form is for; a
    oneDNN graph is read back by dyndq's reader and checked), measured there (the file as written;
    `report.outputs_note` says on what), then `before_placing(report)` is called when given (the
    CLI ranks methods and writes its --report there), and only then is it moved onto `dst`.  An
    error or an interrupt (Ctrl-C, SIGTERM) at any step leaves `dst` as it was.  `dst` naming
    `src` itself is refused (ModelFileError: a model passed in is never modified) unless
    `overwrite`."""
    from dyndq.model_files import DataFile, needs_external_data, read_model
    from dyndq.atomic_writes import ModelFileError, check_target, same_file
    from dyndq.atomic_writes import staged_write
    from dyndq.model_files import write_staged
    from dyndq.quantization.evaluate import checked_samples, user_inputs

    if emit not in EMITS:
        raise OptionError([Problem("emit", repr(emit), ", ".join(EMITS))])
    check_target(dst)  # (a folder, a device, a path ending in "/": refused before any work)
    if not overwrite and same_file(src, dst):
        raise ModelFileError(f"{dst}: is the input model itself; write the quantized model to another file "
                             "(overwrite=True replaces the input)")
    loaded = read_model(src, load_data=False)
    checked = QuantizeOptions.checked(loaded.model, seed=seed, **options)
    samples = checked_samples(samples)
    too_big = sum(nbytes(t) for t in loaded.model.graph.initializer) >= EVALUATE_BELOW
    measure = not too_big if evaluate is None else evaluate
    # (a feed that does not fit: said before any work; a budget is chosen on them too)
    feeds = user_inputs(loaded.model, inputs) if measure or checked.budget is not None or checked.data_aware else None
    chosen_on = budget_feeds(loaded.model, checked, feeds, samples)
    on_disk = Staged(src, dst, loaded, checked, feeds, samples, measure, evaluate, progress, before_placing)

    if emit == "dyndq" and loaded.external_data:
        with staged_write(dst, external_data=True) as stage:
            with open(os.path.join(stage.folder, stage.location), "wb") as f:
                quantized, report = quantize_model(loaded.model, checked, Tensors(loaded, DataFile(f, stage.location)),
                                                   strict=strict, progress=progress, feeds=chosen_on)
            report.emit = emit
            onnx.save_model(quantized, stage.model, format="protobuf")  # (binary, whatever dst's name)
            del quantized
            report.data_file = stage.location
            on_disk.finish(report, stage.model, "dyndq")
    else:
        out, report = quantize_model(loaded.model, checked, Tensors(loaded), strict=strict, progress=progress,
                                     feeds=chosen_on)
        report.emit = emit
        if loaded.external_data:
            _read_what_points_into(out, loaded)
        if emit == "onednn-json":
            from dyndq.onednn import save_json

            doc, weights = onednn_graph(out)
            del out
            # (the JSON and its -weights folder, all or nothing, checked and measured before they are put in place)
            files = save_json(doc, dst, weights, check=lambda staged, folder=None: on_disk.finish_json(
                report, staged, folder, list(weights)))
            if save_weights is not None:
                save_weights(files)
        else:
            if emit != "dyndq":
                lowered, exported = _lowered(out, emit)
                report.emitted = [f"written for {emit}: {exported.summary()}", *exported.lines()]
                out = lowered
                del lowered
            with staged_write(dst, external_data=needs_external_data(out, loaded.external_data)) as stage:
                write_staged(out, stage)
                del out  # (the file is what is checked and measured from here on)
                report.data_file = stage.location
                on_disk.finish(report, stage.model, emit)  # (each emit of a model is a form dyndq.written checks)
    if same_file(src, dst):  # (the model replaced: its data files stay, see atomic_writes.py)
        report.kept_files = [location for location in loaded.locations if location != report.data_file]
    return report


class Staged:
    """What `quantize_file` does to its output in its staging place: check it, measure it, then
    hand the report to `before_placing`."""

    def __init__(self, src, dst, loaded, checked, feeds, samples, measure, evaluate, progress, before_placing):
        self.src, self.dst, self.loaded, self.checked = src, os.fspath(dst), loaded, checked
        self.feeds, self.samples, self.measure, self.evaluate = feeds, samples, measure, evaluate
        self.progress, self.before_placing = progress, before_placing

    def finish(self, report: QuantizeReport, staged: str, form: str) -> None:
        """The model file at `staged`, written for `form`, checked and measured."""
        from dyndq.model_files import load_model, read_model
        from dyndq.quantization.evaluate import ENGINE, Unloadable
        from dyndq.written import verify_model

        # the file read once (measured, the quantized model whole: about bits/32 of the float weights);
        # the evaluation makes ONNX Runtime's session of an exported file as written: for a file written
        # for ONNX Runtime the check's own session is left out then, so the file is loaded there once,
        # unless the evaluation did not get so far
        read = load_model(staged) if self.measure and form == "dyndq" else read_model(staged, load_data=False).model
        as_written = self.measure and form != "dyndq"
        on_engine = as_written and TABLE[form].loads_on[0] == ENGINE
        check = dict(shown_as=self.dst, source=self.src, model=read)
        notes = verify_model(staged, form, load=not on_engine, **check)
        if self.measure:
            try:
                # (an exported file is read by ONNX Runtime itself, its MatMulNBits and all)
                loaded = self._measured(report, read, as_written=staged if as_written else None)
            except Unloadable as e:
                loaded, report.outputs, report.outputs_note = False, [], f"not measured: {e}"
            if on_engine and not loaded:
                notes += verify_model(staged, form, **check)  # (raises, in the engine's words, where it does not load)
        del read
        report.notes += notes
        self._placing(report)

    def finish_json(self, report: QuantizeReport, staged: str, folder: str | None, ports: list[str]) -> None:
        """A oneDNN graph at `staged` (its weights' .npy files in `folder`) read back by dyndq's
        reader, checked, and measured as that reader gives it."""
        from dyndq.written import verify_onednn_json

        model = verify_onednn_json(staged, folder, ports, shown_as=self.dst)
        report.notes.append("not loaded on oneDNN (not here): read back by dyndq's reader and checked")
        if self.measure:
            self._measured(report, ReadBack(model, self.loaded.model, ports))
        self._placing(report)

    def _measured(self, report: QuantizeReport, quantized, as_written: str | None = None) -> bool:
        from dyndq.model_files import load_model
        from dyndq.quantization.evaluate import evaluate_into

        loaded = self.loaded
        # the float model's weights read from its data file for its run, never the whole model loaded
        # (but for external data outside the main graph's initializers, which only a load resolves)
        apart = loaded.external_data and _data_in_initializers_only(loaded.model)
        whole = loaded.model if apart or not loaded.external_data else load_model(self.src)
        return evaluate_into(report, whole, quantized, seed=self.checked.seed, inputs=self.feeds,
                             samples=self.samples, progress=self.progress, loaded=loaded if apart else None,
                             as_written=as_written)

    def _placing(self, report: QuantizeReport) -> None:
        if not self.measure:
            report.outputs_note = ("not measured (the model's weights are 2 GiB or more)" if self.evaluate is None
                                   else "not measured (evaluate=False)")
        if self.before_placing is not None:
            self.before_placing(report)


class ReadBack:
    """A oneDNN graph as dyndq's reader gives it back (its weights made initializers again), run on
    ONNX Runtime with the float model's feeds and giving the float model's outputs: the reader
    names ports by oneDNN's ids, in the float graph's order (its inputs first, then the weights)."""

    how = "onnxruntime, the oneDNN graph as written, read back by dyndq's reader"

    def __init__(self, model: onnx.ModelProto, float_model: onnx.ModelProto, ports: list[str]):
        from dyndq.quantization.evaluate import OnOrt

        initializers = {t.name for t in float_model.graph.initializer}
        float_inputs = [vi.name for vi in float_model.graph.input if vi.name not in initializers]
        inputs = [vi.name for vi in model.graph.input if vi.name not in ports]
        self.inputs = dict(zip(float_inputs, inputs))
        self.outputs = dict(zip([o.name for o in float_model.graph.output], [o.name for o in model.graph.output]))
        self.run = OnOrt(model)
        self.ops = self.run.ops

    def __call__(self, feeds: dict) -> dict:
        got = self.run({self.inputs[name]: value for name, value in feeds.items()})
        return {name: got[theirs] for name, theirs in self.outputs.items()}


def _read_what_points_into(model: onnx.ModelProto, loaded) -> None:
    """The tensors `model` holds as the input held them, pointing into the input's external data
    file (the weights left alone), read into the model: written with the model, they would point
    at a file of that name beside OUT, which there is none of when OUT is in another folder."""
    from onnx import external_data_helper as h

    from dyndq.model_files import tensor_with_data

    for tensor in h._get_all_tensors(model):
        if h.uses_external_data(tensor):
            tensor.CopyFrom(tensor_with_data(tensor, loaded))
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]


def _data_in_initializers_only(model: onnx.ModelProto) -> bool:
    from onnx import external_data_helper as h

    main = sum(h.uses_external_data(t) for t in model.graph.initializer)
    return main == sum(h.uses_external_data(t) for t in h._get_all_tensors(model))


def _lowered(model: onnx.ModelProto, emit: str):
    """(the DynamicDequantize model exported to the form asked for, an export target, the export's report)."""
    from dyndq.exporter import export_with_report

    return export_with_report(model, target=emit)


def onednn_graph(model: onnx.ModelProto) -> tuple[dict, dict]:
    """(oneDNN graph JSON, {port name: array}) of a quantized model: its weights are input ports
    of property_type constant (oneDNN's graph JSON holds no tensor data), their values the arrays."""
    from dyndq.onednn import dump

    weights: dict = {}
    return dump(model, weights_as_inputs=True, weights=weights), weights
