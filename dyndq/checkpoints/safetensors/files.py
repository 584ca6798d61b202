"""A safetensors checkpoint's modules, one at a time.

`read` takes a `.safetensors` file or a folder of them (with `config.json` holding
`quantization_config`, or that dict given) and yields one `Module` at a time: a quantized
module's tensors grouped under its name (`model.layers.0.mlp.down_proj`: `qweight`, `qzeros`,
`scales`, `g_idx`; compressed-tensors' `weight_packed`, `weight_scale`, ...), every other tensor
as a module of its own (format "dense").  The tensors are read by the `safetensors` package
(`safe_open`, NumPy framework: no torch), only when their module is reached; those its NumPy
framework cannot give (float8: safetensors 0.8 looks the dtype up in NumPy, which has none) are
read as their bytes at the header's offsets and viewed as ml_dtypes' type.  `listed` gives the
modules from the files' headers alone (the import lists every module, and reads one when it
decodes it).
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import ml_dtypes
import numpy as np

from dyndq.opdefs import Problem, ValidationError

# the tensors a quantized module holds, by format family (a module is named by what comes before them)
QUANTIZED_SUFFIXES = {"qweight", "qzeros", "scales", "g_idx", "weight_packed", "weight_scale", "weight_zero_point",
                      "weight_shape", "weight_global_scale"}
# the formats taken: quant_method (and compressed-tensors' format) -> the writer's name
TAKEN = "gptq (checkpoint_format gptq, gptq_v2), awq (version gemm, gemv), compressed-tensors (pack-quantized, nvfp4-pack-quantized)"
# safetensors' dtypes NumPy's framework cannot give, read as bytes
RAW_DTYPES = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}


@dataclass
class Module:
    name: str  # the module's name: its weight is `name + ".weight"` (a dense tensor: its own full name)
    format: str  # "gptq", "awq", "pack-quantized", "nvfp4-pack-quantized" or "dense"
    tensors: dict[str, np.ndarray]  # by suffix ("qweight", ...); a dense tensor: {"": the tensor}
    config: dict = field(default_factory=dict)  # the checkpoint's quantization_config

    @property
    def weight_name(self) -> str:
        return self.name if self.format == "dense" else f"{self.name}.weight"

    @property
    def nbytes(self) -> int:
        return sum(int(t.nbytes) for t in self.tensors.values())


# the files older quantizers wrote their settings to, beside the weights, and their quant_method
OLDER_CONFIGS = {"quantize_config.json": "gptq", "quant_config.json": "awq"}  # (AutoGPTQ's, AutoAWQ's)


def quantization_config(path: Path) -> dict | None:
    """config.json's `quantization_config` in folder `path`, else AutoGPTQ's quantize_config.json or
    AutoAWQ's quant_config.json there (their quant_method added), else None."""
    config = path / "config.json"
    if config.is_file() and "quantization_config" in (found := json.loads(config.read_text())):
        return found["quantization_config"]
    for name, method in OLDER_CONFIGS.items():
        if (path / name).is_file():
            return {"quant_method": method, **json.loads((path / name).read_text())}
    return None


AWQ_VERSIONS = ("gemm", "gemv")  # (AutoAWQ's "version"; GEMV_FAST's interleaved packing, ExLlama's and Marlin's are other layouts)


def awq_version(config: dict) -> str:
    """An AWQ checkpoint's packing, lower case: "gemm" (the default, as AutoAWQ's) or "gemv" (awq.py reads both)."""
    return str(config.get("version", "gemm")).lower()


def format_of(config: dict, suffixes: set[str], where: str) -> str:
    """The format of a module holding tensors `suffixes`, by the checkpoint's quantization_config."""
    method = str(config.get("quant_method", "")).lower()
    if method == "gptq":
        return "gptq"
    if method == "awq":
        if awq_version(config) not in AWQ_VERSIONS:
            raise ValidationError([Problem(where, f"an AWQ checkpoint of version {awq_version(config)!r} (not taken yet)",
                                           f"version {' or '.join(AWQ_VERSIONS)}")])
        return "awq"
    if method == "compressed-tensors":
        kind = "nvfp4-pack-quantized" if "weight_global_scale" in suffixes else "pack-quantized"
        stated = config.get("format")
        if stated not in (kind, "mixed-precision", None):
            raise ValidationError([Problem(where, f"a compressed-tensors checkpoint of format {stated!r}",
                                           "pack-quantized or nvfp4-pack-quantized")])
        return kind
    raise ValidationError([Problem(where, f"quant_method {config.get('quant_method')!r}", f"one of: {TAKEN}")])


# safetensors' dtype names -> NumPy's (for a module listed before it is read: its tensors' shapes and sizes)
DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "I64": np.int64,
          "I32": np.int32, "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16,
          "U8": np.uint8, "BOOL": np.bool_, **RAW_DTYPES}
SMALL = {"weight_shape"}  # tensors read when a module is listed (a few integers: the weight's shape)


@dataclass
class Listed:
    """A module as listed from the files' headers, its tensors not read: `stand_in()` has their
    shapes and types (for its weight's shape, its size and kind), `load()` reads them."""
    name: str
    format: str
    keys: dict[str, tuple[Path, str]]  # suffix -> (file, tensor name)
    config: dict
    dtypes: dict[str, str]  # suffix -> safetensors' dtype name
    shapes: dict[str, tuple[int, ...]]

    def load(self) -> Module:
        from safetensors import safe_open

        with contextlib.ExitStack() as stack:
            handles = {f: stack.enter_context(safe_open(str(f), framework="np")) for f in {f for f, _ in self.keys.values()}}
            return Module(self.name, self.format, {suffix: tensor(handles[f], f, key) for suffix, (f, key) in self.keys.items()},
                          self.config)

    def stand_in(self) -> Module:
        """The module with each tensor a read-only array of its shape and type that holds no data
        (one element broadcast: its shape, size and nbytes are the tensor's), but the few read."""
        small = {suffix: self.load_one(suffix) for suffix in self.keys if suffix in SMALL}
        return Module(self.name, self.format, {suffix: small[suffix] if suffix in small else
                                               np.broadcast_to(np.zeros((), DTYPES[self.dtypes[suffix]]), self.shapes[suffix])
                                               for suffix in self.keys}, self.config)

    def load_one(self, suffix: str) -> np.ndarray:
        from safetensors import safe_open

        f, key = self.keys[suffix]
        with safe_open(str(f), framework="np") as handle:
            return tensor(handle, f, key)


def read(path: str | os.PathLike, config: dict | None = None) -> Iterator[Module]:
    """The modules of safetensors checkpoint `path` (a file, or a folder of `*.safetensors`), in the
    files' order, each read when reached.  `config` is the checkpoint's `quantization_config`
    (default: config.json's, beside the file or in the folder)."""
    for module in listed(path, config):
        yield module.load()


def listed(path: str | os.PathLike, config: dict | None = None) -> list[Listed]:
    """The modules of checkpoint `path` as its files' headers list them (`read`'s), none read."""
    try:
        from safetensors import safe_open
    except ImportError as e:  # (an optional extra: dyndq itself runs without it)
        raise ImportError("reading safetensors checkpoints needs the `safetensors` package: pip install 'dyndq[import]'") from e
    path = Path(path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        raise ValidationError([Problem(f"checkpoint {str(path)!r}", "a folder with no *.safetensors file", "one or more")])
    config = config if config is not None else quantization_config(path if path.is_dir() else path.parent)
    out: list[Listed] = []
    where: dict[str, tuple[Path, str, tuple]] = {}  # every tensor's (file, dtype, shape): a module may lie in two shards
    modules: dict[str, dict[str, str]] = {}  # module name -> suffix -> tensor name, in the files' order
    for f in files:  # (one file open at a time: safetensors' open of each maps it, and 34 shards open at once
        # held 17 MiB of their pages, twice a module's bytes: docs/import.md, "Memory")
        with safe_open(str(f), framework="np") as handle:
            for key in handle.keys():
                found = handle.get_slice(key)
                where[key] = (f, found.get_dtype(), tuple(found.get_shape()))
                prefix, _, suffix = key.rpartition(".")
                if suffix in QUANTIZED_SUFFIXES and prefix:
                    modules.setdefault(prefix, {})[suffix] = key
                else:
                    modules.setdefault(key, {})[""] = key
    def entry(name: str, format: str, keys: dict[str, str], config: dict) -> Listed:
        return Listed(name, format, {suffix: (where[key][0], key) for suffix, key in keys.items()}, config,
                      {s: where[key][1] for s, key in keys.items()}, {s: where[key][2] for s, key in keys.items()})

    for name, keys in modules.items():
        if "" in keys and len(keys) > 1:  # (a tensor named like a module, beside its quantized tensors: never seen)
            out.append(entry(name, "dense", {"": keys[""]}, {}))
            del keys[""]
        if "" in keys:
            out.append(entry(name, "dense", keys, {}))
            continue
        if config is None:
            raise ValidationError([Problem(f"checkpoint {str(path)!r}", f"quantized tensors ({name}.{', '.join(keys)}) "
                                           "and no quantization_config (no config.json beside them, none given)",
                                           "config.json holding quantization_config, or the config passed")])
        out.append(entry(name, format_of(config, set(keys), f"module {name!r}"), keys, config))
    return out


def tensor(handle, path: Path, key: str) -> np.ndarray:
    """Tensor `key` (its file opened already by safetensors, `handle`, which checked its header),
    mapped in place from the file's own layout (an 8-byte header length, the JSON header, the
    data), copy-on-write: the pages the decode reads are the file's, never a copy of the whole
    tensor beside them (safetensors' get_tensor copies it out of its own map: twice a module's
    bytes at once, the streamed import's peak; docs/import.md, "Memory")."""
    entry, data_start = _header(str(path))[key], _header(str(path))["__data_start__"]
    dtype = np.dtype(DTYPES[entry["dtype"]]) if entry["dtype"] in DTYPES else None
    if dtype is None:  # (a type of no NumPy row: safetensors' own reading)
        return handle.get_tensor(key)
    start, end = entry["data_offsets"]
    shape = tuple(entry["shape"])
    if end == start:
        return np.empty(shape, dtype)
    return np.memmap(path, dtype, mode="c", offset=data_start + start, shape=shape)


@functools.lru_cache(maxsize=8)
def _header_at(path: str, size: int, mtime: int) -> dict:
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header["__data_start__"] = 8 + length
    return header


def _header(path: str) -> dict:
    """The file's JSON header (read once per file while it is unchanged), and where its data starts."""
    st = os.stat(path)
    return _header_at(path, st.st_size, st.st_mtime_ns)
