"""A GGUF file opened for import: its tensors in the source model's order, and gguf's name map.

Names: gguf's own `TensorNameMap` for the file's `general.architecture` maps a Hugging Face /
torch name (`model.layers.0.self_attn.q_proj.weight`) to the GGUF one (`blk.0.attn_q.weight`).

Experts: llama.cpp's converter stacks a layer's experts into one 3-D tensor
(`blk.N.ffn_gate_exps.weight`, [n_expert, rows, row]); `expert` gives one expert's slice, whole rows
of blocks, as a tensor of its own (matching.py says which weights take one).

Orientation: GGUF's NumPy shape is already torch's ([out, in], the blocks along a row).  But
llama.cpp's converter (convert_hf_to_gguf.py, `LlamaModel.permute`) reorders the rows of
attention Q and K for the llama family: `w.reshape(n_head, 2, rows // n_head // 2, ...)
.swapaxes(1, 2)`, with K's `n_head` its key-value heads where they differ.  GGUF row i is the
source's row perm[i]; the source's rows are GGUF's rows argsort(perm).  Rows are whole blocks
(blocks run along a row), so the undo reorders the tensor's bytes row by row before its nodes
are written: exact, and nothing at run time.  ARCHITECTURES_PERMUTED lists the architectures
whose converter class permutes, and what: read in llama.cpp's converter (the one in the
llama-cpp-python 0.3.16 sdist, and ggml-org/llama.cpp's master for nanbeige): the classes whose
`modify_tensors` calls a `permute` of this form on `q_proj`/`k_proj` (or on Q and K split from a
fused QKV), directly or through LlamaModel's with `undo_permute = True`.  Left out: llama4 and
Mistral's own format (`undo_permute = False`), chameleon (its q_norm/k_norm are permuted another
way, not undone here), clip/mmproj vision towers.  A head count stored per layer (deci,
granitehybrid) is read at the tensor's block.  `unpermute=False` (`--no-unpermute`) leaves the
rows as stored: a checkpoint converted as `llama` from one that was never permuted (Mistral's
consolidated format, say) needs it.
"""
from __future__ import annotations

import mmap
import os
import re

import numpy as np

from dyndq.checkpoints.gguf.tensors import GGUFTensor, nodes, tensors_of
from dyndq.checkpoints.source import Checkpoint, MissingExtra, SourceTensor, opener
from dyndq.opdefs import Problem, ValidationError

# architecture -> the suffixes of Q and K tensors llama.cpp's converter permutes (its class)
_BOTH, _WEIGHTS = (".weight", ".bias"), (".weight",)
ARCHITECTURES_PERMUTED = {
    "llama": _BOTH,  # LlamaModel (and Mistral3Model, InternLM3Model, written as llama)
    "arcee": _BOTH, "smollm3": _BOTH, "nanbeige": _BOTH,  # LlamaModel's subclasses
    "granite": _BOTH, "granitemoe": _BOTH, "granitehybrid": _BOTH,  # GraniteModel(LlamaModel) and its subclasses
    "deci": _BOTH,  # DeciModel, heads per layer
    "llada": _BOTH,  # LLaDAModel
    "deepseek": _BOTH,  # DeepseekModel (not deepseek2)
    "minicpm": _WEIGHTS,  # MiniCPMModel
    "olmo": _WEIGHTS,  # OlmoModel (not olmo2)
    "arctic": _WEIGHTS,  # ArcticModel
    "internlm2": _WEIGHTS,  # InternLM2Model: Q and K split from wqkv, then permuted
    "bailingmoe": _WEIGHTS,  # BailingMoeModel: Q and K split from query_key_value, then permuted
}
_QK = re.compile(r"^blk\.\d+\.attn_(q|k)(\.weight|\.bias)$")
MAGIC = b"GGUF"


@opener("GGUF (.gguf)")
def open_gguf(path: str):
    if not os.path.isfile(path):  # (a folder: another format's)
        return None
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            return None
    return GGUFCheckpoint(path)


class GGUFCheckpoint(Checkpoint):
    format = "GGUF"

    def __init__(self, path: str | os.PathLike, unpermute: bool = True):
        try:
            from gguf import GGUFReader
        except ImportError as e:  # (an optional extra: dyndq itself runs without it)
            raise MissingExtra("reading GGUF files needs the `gguf` package: pip install 'dyndq[import]'") from e
        self.path = os.fspath(path)
        self.unpermute = unpermute
        try:
            self.reader = GGUFReader(self.path, "r")
        except Exception as e:  # noqa: BLE001 - gguf's reader raises several kinds on a damaged file
            raise ValidationError([Problem(f"GGUF file {self.path!r}", f"unreadable ({type(e).__name__}: {e})",
                                           "a GGUF file gguf's reader reads")]) from None
        self.architecture = self._field("general.architecture")
        self._raw = list(tensors_of(self.reader))
        self._by_name = {t.name: t for t in self._raw}
        self._map = self._name_map()

    def _field(self, key: str):
        field = self.reader.get_field(key)
        if field is None:
            return None
        value = field.contents()
        return value

    def _name_map(self):
        from gguf import MODEL_ARCH_NAMES, TensorNameMap

        arch = next((a for a, n in MODEL_ARCH_NAMES.items() if n == self.architecture), None)
        if arch is None:
            return None
        blocks = self._field(f"{self.architecture}.block_count")
        if blocks is None:  # (the highest blk.N of its tensors, plus one)
            blocks = 1 + max((int(t.name.split(".")[1]) for t in self._raw if t.name.startswith("blk.")), default=-1)
        return TensorNameMap(arch, int(blocks))

    def mapped_name(self, weight_name: str) -> str | None:
        """The GGUF tensor of a model's weight by gguf's name map: its name, else its name without
        the first component (an exporter's wrapper: torch.onnx.export of a BertModel names
        `bert.encoder...`, where the map, like llama.cpp's converter, which strips `bert.`, knows
        `encoder...`)."""
        if self._map is None:
            return None
        found = self._map.get_name(weight_name, try_suffixes=(".weight", ".bias"))
        if found is None and "." in weight_name:
            found = self._map.get_name(weight_name.split(".", 1)[1], try_suffixes=(".weight", ".bias"))
        if found is not None and not found.endswith((".weight", ".bias")):
            # (a parameter named without a suffix, transformers 5's fused experts `mlp.experts.down_proj`:
            # the map gives the bare `blk.N.ffn_down_exps`, the file's tensor is its `.weight`)
            found += ".weight"
        return found

    def expert(self, tensor: str, index: int) -> SourceTensor | None:
        """Expert `index` of a 3-D tensor (llama.cpp's converter stacks a layer's experts into one,
        `blk.N.ffn_gate_exps.weight`, NumPy [n_expert, rows, row]): its rows of blocks, a view of the
        file's bytes (the blocks run along the row, so an expert is whole blocks: exact), decoded
        alone; None for a tensor that is not 3-D or an index out of its range."""
        t = self._by_name.get(tensor)
        if t is None or len(t.shape) != 3 or not 0 <= index < t.shape[0]:
            return None
        part = GGUFTensor(f"{tensor}[{index}]", t.type_name, t.shape[1:], t.data[index])
        source = self._source(part)
        source.note = "; ".join(x for x in (f"expert {index} of {tensor}'s {t.shape[0]}", source.note) if x)
        return source

    def notes(self) -> list[str]:
        notes = []
        if self._map is None:
            notes.append(f"architecture {self.architecture!r}: gguf has no tensor-name map of it (names matched as they are)")
        if not self.unpermute and (self.architecture or "") in ARCHITECTURES_PERMUTED:
            notes.append(f"Q/K rows left as stored (unpermute off): llama.cpp's rotary permutation of {self.architecture} "
                         "not undone")
        return notes

    def tensors(self) -> list[SourceTensor]:
        return [self._source(t) for t in self._raw]

    def _source(self, t: GGUFTensor) -> SourceTensor:
        order, note = self._row_order(t)

        def taken(t=t):  # (the rows reordered when the tensor is decoded, not when it is listed: one copy at a time)
            return t if order is None else _rows_taken(t, order)

        def make_values():
            import gguf

            t = taken()
            values = gguf.quants.dequantize(np.ascontiguousarray(t.data), gguf.GGMLQuantizationType[t.type_name])
            return values.astype(np.float32, copy=False).reshape(t.shape)

        def make_nodes(names, name):
            written = nodes(taken(), names, name=name)  # (its tensors copies of the file's bytes)
            self._release()
            return written

        return SourceTensor(t.name, t.shape, f"GGUF {t.type_name}", t.nbytes, make_nodes, make_values, note)

    def _release(self) -> None:
        """The file's pages read so far let go from this process (madvise MADV_DONTNEED on gguf's
        read-only map of it: they stay in the OS's cache, and are read again from there if asked):
        a map keeps every page it has touched resident, so decoding each tensor in turn would
        leave the whole checkpoint in the process's memory by the last."""
        mapped = getattr(self.reader.data, "_mmap", None)  # (np.memmap's mmap.mmap)
        if mapped is not None and hasattr(mapped, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            try:
                mapped.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):  # (a platform without it: the pages stay, as the OS keeps them)
                pass

    def _row_order(self, t: GGUFTensor):
        """(the rows of the source in GGUF's rows, a note) for a permuted Q or K, else (None, "")."""
        found = _QK.match(t.name)
        suffixes = ARCHITECTURES_PERMUTED.get(self.architecture or "")
        if not self.unpermute or not found or not suffixes or found.group(2) not in suffixes:
            return None, ""
        block = int(t.name.split(".")[1])
        n_head = self._heads(t, "head_count", block)
        n_kv = self._heads(t, "head_count_kv", block)
        if n_head is None:
            raise ValidationError([Problem(f"GGUF tensor {t.name!r}", f"no {self.architecture}.attention.head_count "
                                           "in the file", "the head count (to undo llama.cpp's row permutation)")])
        n = n_kv if found.group(1) == "k" and n_kv is not None and n_kv != n_head else n_head
        if n <= 0:
            raise ValidationError([Problem(f"GGUF tensor {t.name!r}", f"{n} heads in block {block}",
                                           "a positive head count (to undo llama.cpp's row permutation)")])
        rows = t.shape[0]
        if rows % (2 * n):
            raise ValidationError([Problem(f"GGUF tensor {t.name!r}", f"{rows} rows", f"a multiple of 2 x {n} heads")])
        perm = np.arange(rows).reshape(n, 2, rows // n // 2).swapaxes(1, 2).reshape(rows)
        return np.argsort(perm), f"rows un-permuted (llama.cpp's rotary permutation of {n} heads undone)"


    def _heads(self, t: GGUFTensor, key: str, block: int) -> int | None:
        """`{arch}.attention.{key}`: one count, or a count per layer (deci, granitehybrid) read at `block`."""
        value = self._field(f"{self.architecture}.attention.{key}")
        if value is None or not isinstance(value, (list, tuple)):
            return None if value is None else int(value)
        if block >= len(value):
            raise ValidationError([Problem(f"GGUF tensor {t.name!r}", f"{self.architecture}.attention.{key} of "
                                           f"{len(value)} layers", f"a count for block {block}")])
        return int(value[block])


def _rows_taken(t: GGUFTensor, order: np.ndarray) -> GGUFTensor:
    """The tensor with its rows (its first axis) in `order`: whole rows of blocks, bytes moved as they are.
    A 1-D tensor (a bias) is one row: its elements are moved, which only a type of one element a
    block (F32, F16, BF16) allows."""
    if len(t.shape) >= 2:
        return GGUFTensor(t.name, t.type_name, t.shape, np.ascontiguousarray(t.data[order]))
    from dyndq.checkpoints.gguf.registry import get

    kind = get(t.type_name)
    if kind is None or kind.block != 1:
        raise ValidationError([Problem(f"GGUF tensor {t.name!r}", f"a 1-D {t.type_name} tensor whose elements llama.cpp's "
                                       "converter permuted", "a type of one element a block (F32, F16, BF16)")])
    data = np.ascontiguousarray(t.data).reshape(t.shape[0], -1)[order].reshape(-1)
    return GGUFTensor(t.name, t.type_name, t.shape, data)


__all__ = ["ARCHITECTURES_PERMUTED", "GGUFCheckpoint", "open_gguf"]
