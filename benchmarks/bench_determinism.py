"""Do the data-aware methods write the same bytes in another process, at another thread count?

For each trained model (MiniLM, PP-OCRv4's recognizer, magika: bench_data_aware.py's prepared
models and calibration samples) a child process per setting quantizes with every data-aware
method and prints the sha256 of each written model, of each calibration input's activations (the
rows ONNX Runtime gave, over the samples) and of its statistics (X^T X, the channel sums); the
parent lines them up and says which differ between settings.  Settings: NumPy's BLAS threads
(OMP_NUM_THREADS and OPENBLAS_NUM_THREADS) and ONNX Runtime's intra-op threads (what a session of
the library takes when the caller does not choose: DYNDQ_PROBE_ORT_THREADS makes the child's
sessions take that count, to stand for a machine with that many cores).

    .venv/bin/python benchmarks/bench_determinism.py [--models minilm,ppocr,magika] [--samples 8]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTINGS = {  # name -> environment
    "default": {},  # (the caller's: BLAS and ONNX Runtime at their defaults, one thread per core)
    "blas1-ort1": {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "DYNDQ_PROBE_ORT_THREADS": "1"},
    "blas2-ort2": {"OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2", "DYNDQ_PROBE_ORT_THREADS": "2"},
    "blas2-ort2-again": {"OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2", "DYNDQ_PROBE_ORT_THREADS": "2"},
    "blas1-ort2": {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "DYNDQ_PROBE_ORT_THREADS": "2"},
    "blas2-ort1": {"OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2", "DYNDQ_PROBE_ORT_THREADS": "1"},
}
METHODS = {
    "gptq": {"method": "gptq"},
    "gptq-act_order": {"method": "gptq", "act_order": True},
    "awq": {"method": "awq"},
    "rtn+se": {"method": "rtn", "scale_estimation": True},
    "search+se": {"method": "search", "scale_estimation": True},
    "gptq+se": {"method": "gptq", "scale_estimation": True},
    "awq+se": {"method": "awq", "scale_estimation": True},
}


def sha(data) -> str:
    import numpy as np

    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def child(model_name: str, samples: int, methods: list[str], memory: str | None) -> None:
    import numpy as np

    sys.path.insert(0, str(HERE))
    import bench_data_aware as bench

    threads = os.environ.get("DYNDQ_PROBE_ORT_THREADS")
    if threads:
        from dyndq import ort_session

        made = ort_session._session

        def session(source, **settings):
            if settings.get("threads") is None:
                settings["threads"] = int(threads)
            return made(source, **settings)

        ort_session._session = session

    from dyndq.quantization import activations

    stats_seen = {}
    added = activations.ActivationStats.add

    def add(self, rows):  # (the rows ONNX Runtime gave, hashed as they come)
        if not hasattr(self, "rows_hash"):
            self.rows_hash = hashlib.sha256()
        self.rows_hash.update(np.ascontiguousarray(rows).tobytes())
        return added(self, rows)

    activations.ActivationStats.add = add
    collect = activations.collect

    def collecting(model, inputs, feeds, **kw):
        out = collect(model, inputs, feeds, **kw)
        for i, s in out.items():
            stats_seen.setdefault(i.value, set()).add(
                (s.rows_hash.hexdigest()[:16], sha(s.abs_sum), sha(s.abs_max)))
            if s.gram is not None:
                stats_seen.setdefault(i.value + " X^T X", set()).add(sha(s.gram))
        return out

    activations.collect = collecting
    from dyndq.quantization import calibration

    calibration.collect = collecting

    case = {"minilm": bench.minilm_case, "ppocr": bench.ppocr_case, "magika": bench.magika_case}[model_name](samples, 4)
    import dyndq

    out = {"models": {}, "seconds": {}, "cpu": {}}
    for name in methods:
        options = dict(METHODS[name])
        if memory:
            options["calibration_memory"] = memory
        started, cpu = time.perf_counter(), time.process_time()
        q, _ = dyndq.quantize(case.model, bits=4, group_size=case.group, ops=("MatMul",), exclude=case.excluded,
                              inputs=case.calibration, evaluate=False, **options)
        out["seconds"][name] = round(time.perf_counter() - started, 2)
        out["cpu"][name] = round(time.process_time() - cpu, 2)
        out["models"][name] = sha(q.SerializeToString())
    out["stats"] = {k: sorted(v) for k, v in stats_seen.items()}
    print(json.dumps(out))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="minilm,ppocr,magika")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--calibration-memory", default=None, help="also run each setting with this bound")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        model, samples, methods, memory = args.child
        child(model, int(samples), methods.split(","), None if memory == "-" else memory)
        return 0
    differs = False
    for model in args.models.split(","):
        results = {}
        runs = [(s, "-") for s in args.settings.split(",")]
        if args.calibration_memory:
            runs.append((args.settings.split(",")[0], args.calibration_memory))
        for setting, memory in runs:
            env = {**os.environ, **SETTINGS[setting]}
            done = subprocess.run([sys.executable, __file__, "--child", model, str(args.samples), args.methods, memory],
                                  env=env, capture_output=True, text=True)
            label = setting + ("" if memory == "-" else f" mem={memory}")
            if done.returncode:
                print(f"{model} {label}: failed\n{done.stderr[-1500:]}", flush=True)
                differs = True
                continue
            results[label] = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{model} {label}: wall {results[label]['seconds']} cpu {results[label]['cpu']}", flush=True)
        labels = list(results)
        first = results[labels[0]]
        for name in first["models"]:
            codes = {label: results[label]["models"][name] for label in labels}
            same = len(set(codes.values())) == 1
            differs |= not same
            print(f"  {model} {name:16s} {'same' if same else 'DIFFER'}  " + " ".join(codes.values()))
        for value in first["stats"]:
            got = {label: tuple(map(tuple, results[label]["stats"].get(value, []))) for label in labels}
            if len(set(got.values())) != 1 or any(len(g) != 1 for g in got.values()):
                print(f"  {model} input {value!r}: statistics differ ({len(set(got.values()))} sets of versions over the "
                      f"settings; within a process: {max(len(g) for g in got.values())} versions)")
    return 1 if differs else 0


if __name__ == "__main__":
    raise SystemExit(main())
