"""The README's command-line transcripts are what the commands print.

Each `$ dyndq ...` line of the README's Command line section is run (in a fresh
folder, in order, through the CLI's real entry point); every line the README
shows under it must appear in what it printed, and a `# exit code N` comment
must be its exit code. Lines with timings, and lines the README elides with
"...", are not compared.
"""
from pathlib import Path

import onnx

from cases import readme_transcripts

from dyndq.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def transcripts():
    """(argv, exit code, [expected lines]) for each `$ dyndq` command of the Command line section."""
    return readme_transcripts(README.read_text(), "## Command line")


def comparable(line: str) -> bool:
    return line.strip() and "..." not in line and " ms " not in line and not line.rstrip().endswith(" ms")


def make_broken(folder: Path) -> None:
    model = onnx.load(folder / "dyndq-demo" / "model.onnx")
    for a in model.graph.node[0].attribute:
        if a.name == "axis":
            a.i = 0
    model.graph.node[4].attribute.append(onnx.helper.make_attribute("axis", "1"))
    onnx.save(model, folder / "broken.onnx")


def test_readme_command_transcripts(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    runs = transcripts()
    assert [argv[0] for argv in (r[0] for r in runs)][:1] == ["demo"]
    assert {r[0][0] for r in runs} >= {"demo", "check", "export", "lift", "run", "schema"}
    for argv, code, shown in runs:
        got = main(argv)
        out, err = capsys.readouterr()
        printed = {" ".join(line.split()) for line in (out + err).splitlines()}
        assert got == code, (argv, got, err)
        for line in filter(comparable, shown):
            assert " ".join(line.split()) in printed, f"`dyndq {' '.join(argv)}` did not print {line!r}"
        if argv[0] == "demo":
            make_broken(tmp_path)
