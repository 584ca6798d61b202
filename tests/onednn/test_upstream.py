"""The upstream graphs of oneDNN's benchdnn inputs (tests/data/onednn/upstream): each judged as its
MANIFEST.tsv says, the manifest in step with the folder's README and docs/onednn.md."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

import dyndq
from dyndq import onednn

ROOT = Path(__file__).resolve().parents[2]

UPSTREAM = ROOT / "tests" / "data" / "onednn" / "upstream"


def test_dropout_is_refused_saying_why():
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(UPSTREAM / "pattern/f32/softmax_dropout.json")
    [p] = e.value.problems
    assert (p.op, p.argument) == ("Dropout", "kind") and "random numbers" in p.allowed


def _manifest() -> dict[str, tuple[str, str, str]]:
    """path -> (commit, verdict, reason), from the upstream folder's MANIFEST.tsv."""
    rows = (line.split("\t") for line in (UPSTREAM / "MANIFEST.tsv").read_text().splitlines() if not line.startswith("#"))
    return {path: (commit, verdict, reason) for path, commit, verdict, reason in rows}


MANIFEST = _manifest()

EXPECTED_STEP = {"ok": "ok", "refused": "load"}  # the step the judge stops at, by the manifest's verdict

BIG = {"complex_fusion/mha-f32-softmax/sdpa-plain-wo-mask-f16-with-f32-softmax.json",  # 1.9 GB peak
       "complex_fusion/mha/jsons/torchbench/graph-100002-4077425134136159961.json",  # 1.3 GB peak
       "complex_fusion/mha/sdpa-plain-bottom-right-implicit-causal-mask-f16-f32.json"}  # 3.9 GB peak

UPSTREAM_GRAPHS = sorted(str(p.relative_to(UPSTREAM)) for p in UPSTREAM.rglob("*.json"))


@pytest.mark.parametrize("graphs", [
    pytest.param([p for p in UPSTREAM_GRAPHS if p not in BIG], id="within-2-GiB"),
    pytest.param(sorted(BIG), id="over-2-GiB", marks=pytest.mark.big),
])
def test_each_upstream_graph_imports_checks_runs_and_agrees(graphs):
    """Each copied graph is judged as MANIFEST.tsv says: it imports, checks, runs on both engines and
    agrees (ok), or is refused at load (Dropout).  The judge is the benchmark's
    (benchmarks/onednn_upstream.py, run as a script over the graphs: one line each)."""
    script = ROOT / "benchmarks" / "onednn_upstream.py"
    out = subprocess.run([sys.executable, str(script), *(str(UPSTREAM / p) for p in graphs)], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    lines = re.findall(r"^(?:ok|FAILED at (\w+)): upstream/(\S+) \(.*$", out.stdout, re.M)
    got = {path: step or "ok" for step, path in lines}
    want = {p: EXPECTED_STEP[MANIFEST[p][1]] for p in graphs}
    assert got == want, out.stdout[-3000:] + out.stderr[-3000:]


def test_the_manifest_holds_every_copied_graph_at_the_commit_the_readme_names():
    readme = (UPSTREAM / "README.md").read_text()
    copied = sorted(str(p.relative_to(UPSTREAM)) for p in UPSTREAM.rglob("*.json"))
    for path in copied:
        commit, verdict, reason = MANIFEST[path]
        assert f"| `{path}` | {commit} |" in readme and reason.endswith("copied here"), path
    assert sorted(p for p, (_, _, reason) in MANIFEST.items() if reason.endswith("copied here")) == copied
    assert {verdict for _, verdict, _ in MANIFEST.values()} <= {"ok", "refused", "not run", "not fetched"}


def test_the_docs_give_the_manifest_counts():
    """docs/onednn.md's table of verdicts and its count of the copied graphs are the manifest's."""
    import re

    docs = (ROOT / "docs" / "onednn.md").read_text()
    counts = {}
    for _, verdict, _ in MANIFEST.values():
        counts[verdict] = counts.get(verdict, 0) + 1
    table = {row[0].split(":")[0]: int(row[1]) for row in re.findall(r"^\| ([a-z][^|]*?) \| (\d+) \|", docs, re.M)}
    assert table == counts
    copied = [p for p in MANIFEST if MANIFEST[p][2].endswith("copied here")]
    data = ROOT / "tests" / "data" / "onednn"
    anchors = [p for p in data.rglob("*.json") if p.relative_to(data).parts[0] in ("op", "complex_fusion")]
    ok = len(anchors) + sum(MANIFEST[p][1] == "ok" for p in copied)
    assert f"    {ok} of {len(anchors) + len(copied)} upstream graphs import, check, run on both engines and agree" in docs
    assert f"{len(MANIFEST)} in all" in docs
