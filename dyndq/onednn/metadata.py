"""What `load` leaves in a model's metadata, read back with checks: each op's JSON (`onednn.op` on
its main node, with `onednn.id` on each of its nodes) and each tensor's property and layout type
(`onednn.tensors` on the model).  `dump` and `example_inputs` read them; a model edited or written
by hand may hold anything there, so each reader gets the entry checked or a ValueError saying
what is wrong with it, never a KeyError deep inside."""
from __future__ import annotations

import json

INT64 = (-2**63, 2**63 - 1)


def op_entry(text: str) -> dict:
    """The op `load` wrote into `onednn.op`, checked field by field; ValueError saying what is wrong."""
    entry = _json(text)
    if not isinstance(entry, dict):
        raise ValueError(f"a JSON {type(entry).__name__}, not an object")
    if not _int(entry.get("id")):
        raise ValueError("no integer id")
    for key in ("name", "kind"):
        if not isinstance(entry.get(key), str):
            raise ValueError(f"no {key} (a string)")
    attrs = entry.get("attrs")
    if not isinstance(attrs, dict) or not all(isinstance(a, dict) and "value" in a and isinstance(a.get("type", ""), str)
                                              for a in attrs.values()):
        raise ValueError("attrs that are not {name: {\"type\": ..., \"value\": ...}}")
    for side in ("inputs", "outputs"):
        ids, names = entry.get(side), entry.get(f"{side[:-1]}_names")
        if not isinstance(ids, list) or not all(_int(i) for i in ids):
            raise ValueError(f"{side} that are not a list of tensor ids")
        if not isinstance(names, list) or len(names) != len(ids) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{side[:-1]}_names that are not one value name per tensor of {side}")
    if "position" in entry and not (_int(entry["position"]) and entry["position"] >= 0):
        raise ValueError("a position that is no index")
    layouts = entry.get("layouts")
    if layouts is not None and not (isinstance(layouts, list) and len(layouts) == len(entry["inputs"]) + len(entry["outputs"])
                                    and all(_layout(x) for x in layouts)):
        raise ValueError("layouts that are not [shape, stride, layout type, property type] per tensor")
    return entry


def tensor_hints(text: str) -> dict[str, list[str]]:
    """`onednn.tensors`: tensor id -> [property type, layout type]; ValueError saying what is wrong."""
    hints = _json(text)
    if not isinstance(hints, dict) or not all(k.lstrip("-").isdigit() and isinstance(v, list) and len(v) == 2
                                              and all(isinstance(x, str) for x in v) for k, v in hints.items()):
        raise ValueError("not {tensor id: [property type, layout type]}")
    return hints


def _json(text: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError("malformed JSON (or integers of over 4,300 digits, or nested too deep)") from None


def _int(x) -> bool:
    return type(x) is int and INT64[0] <= x <= INT64[1]


def _layout(x) -> bool:
    return (isinstance(x, list) and len(x) == 4 and all(isinstance(v, list) and all(_int(d) for d in v) for v in x[:2])
            and all(isinstance(v, str) for v in x[2:]))
