"""pprobe in a Jupyter notebook: a real IPython kernel (nbclient) runs the cells of
docs/notebook.md's example and the test reads what the notebook displays."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import REPO, clean_env

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

CELLS = [
    "import numpy as np\nimport pprobe",
    # the probe on for one cell's block
    'with pprobe.probe(mode="stats") as run:\n'
    "    a = np.linspace(0.0, 1.0, 5)\n"
    "    b = np.add(a, 1.0)\n"
    "    c = np.log(a)\n"
    "print(run is not None)",
    "pprobe.summary(run)",
    "s = pprobe.summary(run)\n"
    "s.data['ops']['rows'], sorted(x['op'] for x in s.data['top_ops_by_calls'])",
    "pprobe.show(2, run=run)",
    # the probe on across cells: SQL and the summary of the run as it is now
    'pprobe.enable(mode="stats")',
    "for i in range(3):\n    np.multiply(np.arange(4.0), i)",
    'pprobe.sql("SELECT op, count(*) AS calls FROM ops GROUP BY op ORDER BY op")',
    "pprobe.summary().data['ops']['rows']",
    "pprobe.disable()",
]


def _outputs(cell: dict) -> dict[str, str]:
    out: dict[str, str] = {}
    for o in cell["outputs"]:
        if o["output_type"] == "stream":
            key = o["name"]  # stdout, stderr
            out[key] = out.get(key, "") + o["text"]
        elif o["output_type"] in ("execute_result", "display_data"):
            out.update(o["data"])
        elif o["output_type"] == "error":
            raise AssertionError("\n".join(o["traceback"]))
    return out


def test_summary_and_show_render_as_tables_in_a_notebook(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    env = clean_env(PPROBE_OUTPUT=str(tmp_path / "out"), PYTHONPATH=str(REPO))
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3")
    client.execute(cwd=str(tmp_path), env=env)
    outs = [_outputs(c) for c in nb.cells]

    assert outs[1]["stdout"] == "True\n"
    # NumPy's warning names the cell's line, as without the probe
    assert ":4: RuntimeWarning: divide by zero encountered in log" in outs[1]["stderr"]
    html = outs[2]["text/html"]  # the summary: HTML tables, its text beside them
    assert html.startswith("<div class='pprobe'>") and html.count("<table>") >= 3
    for op in ("numpy.linspace", "numpy.add", "numpy.log"):
        assert f">{op}</td>" in html
        assert op in outs[2]["text/plain"]
    assert outs[3]["text/plain"] == "(3, ['numpy.add', 'numpy.linspace', 'numpy.log'])"
    show = outs[4]["text/html"]  # seq 2 is np.log: its input and output with statistics
    assert "numpy.log" in show and ">input</td>" in show and ">output</td>" in show
    assert "numpy.log" in outs[4]["text/plain"] and "1 inf!" in outs[4]["text/plain"]
    live = outs[7]["text/html"]  # rows not flushed yet are there
    assert "2 rows" in live and ">numpy.multiply</td>" in live and ">numpy.arange</td>" in live
    assert outs[8]["text/plain"] == "6"
