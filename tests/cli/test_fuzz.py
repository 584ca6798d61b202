"""The command line fuzzed: hypothesis draws argument vectors for each command from its own argparse
options (valid and invalid values, existing and missing files, small models of the suite, a folder
where a file goes, OUT naming IN) and runs them through `cli.main`.  Whatever it draws, the exit
code is never 70 (an internal error) and no traceback is printed; and a command that fails leaves
every file as it was (nothing at OUT, no staging file, no report or folder half made).

Bounded and deterministic: the default hypothesis profile (tests/conftest.py: derandomized, no
database) draws the same EXAMPLES argument vectors per command on every run (about 25 s in all on
a 2-core machine, with the API's fuzzing); `pytest --hypothesis-profile explore tests/cli/test_fuzz.py`
draws new ones, and DYNDQ_FUZZ_EXAMPLES=N N of them per command.  A drawn example that takes over
a minute (a hang) fails as hypothesis' deadline.  `demo` (no input, its one option a folder: tests/cli/test_commands.py covers it) and
`schema` (no arguments) are not fuzzed."""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import os
import shutil
import tempfile
from datetime import timedelta

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from dyndq.cli import build_parser, main
from dyndq.demo import build_model, demo_input
from dyndq.model_files import save_model

from quantize_models import mlp

EXAMPLES = int(os.environ.get("DYNDQ_FUZZ_EXAMPLES", "100"))  # argument vectors per command (the env: more, to look)
KIND = os.path.join(os.path.dirname(__file__), "..", "data", "onednn", "kinds", "DynamicDequantize.json")
FUZZED = ("check", "export", "lift", "run", "import-onednn", "export-onednn", "quantize", "import-weights")


def _invalid() -> onnx.ModelProto:
    """Our op with an axis beyond its input's rank (check finds it; export and run refuse it)."""
    node = helper.make_node("DynamicDequantize", ["w", "s"], ["d"], name="dq", domain=dyndq.DOMAIN,
                            qtype="per_channel", axis=2)
    g = helper.make_graph([node, helper.make_node("MatMul", ["x", "d"], ["y"], name="mm")], "bad",
                          [helper.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, 3])],
                          [nh.from_array(np.zeros((4, 3), np.int8), "w"), nh.from_array(np.ones(3, np.float32), "s")])
    return dyndq.make_model(g)


def _output_dtype(code: int) -> onnx.ModelProto:
    """DynamicDequantize-3 with an output_dtype of `code` (999: no dtype has it)."""
    node = helper.make_node("DynamicDequantize", ["x", "s"], ["y"], domain=dyndq.DOMAIN, name="dq", output_dtype=code)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.INT8, [4]),
                                        helper.make_tensor_value_info("s", T.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [4])])
    return dyndq.make_model(g, versions={dyndq.DOMAIN: 3})


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """The files argument vectors name, made once (each example works on its own copy)."""
    d = tmp_path_factory.mktemp("pool")
    small = mlp(k=32, n=16, vocab=8)
    save_model(small, d / "float.onnx")
    save_model(small, d / "ext.onnx", external_data=True)
    save_model(build_model(), d / "dq.onnx")
    save_model(dyndq.export(build_model()), d / "std.onnx")
    save_model(dyndq.export(dyndq.quantize(small, evaluate=False, group_size=16)[0], target="onnxruntime"),
               d / "ort.onnx")
    save_model(_invalid(), d / "invalid.onnx")
    save_model(_output_dtype(999), d / "odtype.onnx")
    shutil.copy(KIND, d / "graph.json")
    (d / "bad.json").write_text('{"graph": [')
    _checkpoints(d)
    (d / "text.txt").write_text("hello")
    np.save(d / "ids.npy", np.array([1, 7], np.int64))
    np.save(d / "ids_empty.npy", np.zeros(0, np.int64))
    np.save(d / "ids_big.npy", np.array([1000], np.int64))
    np.save(d / "ids_2d.npy", np.zeros((2, 2), np.int64))
    np.save(d / "f32.npy", np.ones((2, 4), np.float32))
    np.save(d / "x.npy", demo_input())
    np.save(d / "nan.npy", np.full(demo_input().shape, np.nan, np.float32))
    for folder, files in (("samples", {"ids.npy": np.array([3], np.int64)}), ("xdir", {"x.npy": demo_input()}),
                          ("empty", {})):
        (d / folder).mkdir()
        for name, value in files.items():
            np.save(d / folder / name, value)
    return d


CHECKPOINTS = ["pool/m.gguf", "pool/shape.gguf", "pool/nomatch.gguf", "pool/float.onnx", "pool/text.txt",
               "pool/missing.gguf", "pool"]
MODELS = ["pool/float.onnx", "pool/ext.onnx", "pool/dq.onnx", "pool/std.onnx", "pool/ort.onnx", "pool/invalid.onnx",
          "pool/odtype.onnx", "pool/text.txt", "pool/missing.onnx", "pool", "pool/graph.json"]
GRAPHS = ["pool/graph.json", "pool/bad.json", "pool/float.onnx", "pool/missing.json", "pool"]
# the inputs a command is meant for, drawn as often as all the others together (a command mostly
# refusing what it is not for would leave its work unfuzzed)
MEANT = {"check": ["pool/dq.onnx", "pool/invalid.onnx", "pool/ort.onnx"], "export": ["pool/dq.onnx", "pool/ort.onnx"],
         "lift": ["pool/std.onnx", "pool/ort.onnx"], "run": ["pool/dq.onnx", "pool/float.onnx"],
         "export-onednn": ["pool/dq.onnx", "pool/odtype.onnx"], "quantize": ["pool/float.onnx", "pool/ext.onnx"],
         "import-onednn": ["pool/graph.json"], "import-weights": ["pool/float.onnx", "pool/ext.onnx"]}
OUTS = ["out/new.onnx", "out/new.json", "out/no/such/folder/new.onnx", "out/", "out", "IN", "out/existing.onnx",
        "out/new.onnx/."]
NPYS = ["pool/ids.npy", "pool/ids_empty.npy", "pool/ids_big.npy", "pool/ids_2d.npy", "pool/f32.npy", "pool/x.npy",
        "pool/nan.npy", "pool/text.txt", "pool/missing.npy"]
FOLDERS = ["pool/samples", "pool/xdir", "pool/empty", "pool/missing", "pool/text.txt"]
# values per option (its dest), valid and not; an option with choices also draws one not among them
VALUES = {
    "opset": ["1", "13", "17", "19", "21", "23", "25", "28", "31", "-1", "abc"],
    "accuracy_level": ["0", "4", "5", "-1"],
    "seed": ["0", "1", "-1", str(2**40)],
    "max_input_bytes": ["0", "1", "1000", "-5", str(10**12)],
    "bits": ["2", "4", "8", "3"],
    "budget": ["0", "-1", "nan", "inf", "2.1", "4.3", "8.4", "1e308", "x"],
    "format_choices": ["int2,int4", "mxfp4,nvfp4", "int4", "int3", "", ",,", "int8,int8"],
    "group_size": ["-1", "0", "1", "2", "16", "32", "128", "1000", str(2**40), "-7"],
    "samples": ["0", "1", "2", "-1"],  # (not a huge count: a million samples is a million runs, not a bug)
    "damping": ["0", "-1", "nan", "inf", "0.01", "1e-300", "1e308", "x"],
    "block_size": ["0", "1", "-3", "128", str(2**40)],
    "calibration_memory": ["1", "0", "-1", "512MiB", "1TiB", "0.5KB", "x", "1e3", ""],
    "ops": ["MatMul", "Gather,Gemm", ",", "Conv", "MatMul,MatMul"],
    "exclude": ["E", "W1", "fc1", "nope", ""],
    "outputs": ["y", "nope", "h", "x", ""],
    "output_dir": ["out/outs", "out/existing.onnx", "out/outs/", "pool"],
    "report": ["out/r.json", "out/r.md", "out/r.txt", "out/", "IN", "out/new.onnx"],
    "inputs_dir": FOLDERS,
    "input": [f"{name}={npy}" for name in ("ids", "x", "nope") for npy in NPYS] + ["ids", "=pool/ids.npy", "ids="],
    "names": ["pool/map.json", "pool/badmap.json", "pool/listmap.json", "pool/bad.json", "pool/text.txt",
              "pool/missing.json"],
    "output": ["out/new.onnx", "out/new.onnx", *OUTS],  # (import-weights' -o)
}
SKIP = {"output", "input_", "model", "graph", "out", "help"}  # (positionals, drawn apart)


def _checkpoints(d) -> None:
    """GGUF files for import-weights (where gguf is installed): the pool model's E and W1 in Q8_0 and
    Q4_0, one whose E is of another shape, one matching nothing; --names maps."""
    import json

    try:
        import gguf
    except ImportError:
        return
    q8, q4 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0
    rng = np.random.default_rng(0)
    for name, tensors in (("m", {"E": ((8, 32), q8), "W1": ((16, 32), q4)}), ("shape", {"E": ((4, 32), q8)}),
                          ("nomatch", {"other": ((2, 32), q8)})):
        writer = gguf.GGUFWriter(str(d / f"{name}.gguf"), "llama")
        for tensor, (shape, kind) in tensors.items():
            writer.add_tensor(tensor, gguf.quants.quantize(rng.standard_normal(shape).astype(np.float32), kind),
                              raw_dtype=kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    (d / "map.json").write_text(json.dumps({"W1": "W2"}))
    (d / "badmap.json").write_text(json.dumps({"nope": "E"}))
    (d / "listmap.json").write_text("[1]")


def _parsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _value(action) -> st.SearchStrategy[str]:
    if action.dest in VALUES:
        return st.sampled_from(VALUES[action.dest])
    if action.choices is not None and not isinstance(action.choices, range):
        return st.sampled_from([str(c) for c in action.choices] + ["bogus"])
    raise AssertionError(f"no values for {action.dest} ({action.option_strings}): add them to VALUES")


@st.composite
def argv_of(draw, command: str) -> list[str]:
    parser = _parsers()[command]
    argv = [command]
    for action in parser._actions:
        if action.option_strings:
            continue
        if action.dest == "output":  # (a new file as often as all the others together: the work is fuzzed too)
            argv.append(draw(st.one_of(st.just("out/new.json" if command == "export-onednn" else "out/new.onnx"),
                                       st.sampled_from(OUTS))))
        else:
            every = GRAPHS if action.dest == "graph" else CHECKPOINTS if action.dest == "checkpoint" else MODELS
            meant = ["pool/m.gguf"] if action.dest == "checkpoint" else MEANT[command]
            argv.append(draw(st.one_of(st.sampled_from(meant), st.sampled_from(every))))
    options = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    drawn = draw(st.lists(st.sampled_from(options), max_size=4, unique_by=lambda a: a.dest)) if options else []
    for action in drawn:
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:
            argv.append(flag)
            continue
        for _ in range(draw(st.integers(1, 2)) if isinstance(action, argparse._AppendAction) else 1):
            argv += [flag, draw(_value(action))]
    return argv


def _snapshot(root: str) -> dict[str, str]:
    """Every file and folder under `root`: its path and a hash of its bytes (None for a folder)."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            seen[os.path.relpath(os.path.join(folder, d), root)] = None
        for f in files:
            path = os.path.join(folder, f)
            with open(path, "rb") as fh:
                seen[os.path.relpath(path, root)] = hashlib.sha256(fh.read()).hexdigest()
    return seen


def _run(pool, argv: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="dyndq-fuzz-") as root:
        shutil.copytree(pool, os.path.join(root, "pool"))
        os.mkdir(os.path.join(root, "out"))
        shutil.copy(os.path.join(pool, "float.onnx"), os.path.join(root, "out", "existing.onnx"))
        given_in = os.path.join(root, argv[1])

        def resolved(a: str) -> str:  # (absolute paths only: nothing is written where the test runs)
            if a == "IN":
                return given_in
            if a.startswith(("pool", "out")):
                return os.path.join(root, a) + ("/" if a.endswith("/") else "")
            name, sep, value = a.partition("=")
            return f"{name}={resolved(value)}" if sep and value.startswith("pool") else a

        argv = [argv[0]] + [resolved(a) for a in argv[1:]]
        before = _snapshot(root)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
        said = err.getvalue()
        assert code in (0, 1, 2), (argv, code, said)
        assert "internal error" not in said and "Traceback" not in said, (argv, said)
        after = _snapshot(root)
        staging = [p for p in after if os.path.basename(p).startswith(".") and p.endswith(".tmp")]
        assert not staging, (argv, staging)
        if code != 0:  # (all or nothing: a command that fails changes no file)
            assert after == before, (argv, code, said, {k for k in set(after) | set(before)
                                                          if after.get(k, 0) != before.get(k, 0)})


@pytest.mark.parametrize("command", FUZZED)
def test_no_argument_vector_is_an_internal_error_or_leaves_a_file_changed(pool, command):
    @settings(max_examples=EXAMPLES, deadline=timedelta(seconds=60),
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(argv_of(command))
    def fuzz(argv):
        _run(pool, argv)

    fuzz()


def test_every_option_of_every_command_has_values_to_draw():
    """An option added to a command without a pool of values here fails this test, not the fuzzing."""
    for command in FUZZED:
        for action in _parsers()[command]._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction) and action.nargs != 0:
                _value(action)
