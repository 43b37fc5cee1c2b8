"""``pprobe report``: the data it aggregates (checked against values the probed programs
compute themselves), the command line, and the page opened in headless Chromium.

Chromium is Debian's ``chromium`` package (.ci/run installs it where it is missing); the
browser tests skip, saying why, where it is not installed. Screenshots are kept under
``test-artifacts/report/`` (git-ignored; CI keeps them as artifacts).
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from helpers import REPO, clean_env, npy_files, run_script

from pprobe import report
from pprobe.report_html import render

ARTIFACTS = REPO / "test-artifacts" / "report"
SECTIONS = ("overview", "by_op", "by_module", "timeline", "heatmap", "alerts", "dumps")

NUMPY_PROG = """
import numpy as np
import pprobe

x = np.arange(1.0, 9.0)
for s in range(5):
    pprobe.step(s)
    y = np.multiply(x, s + 1)
    z = np.add(y, 1.0)
    np.sum(z)
"""

NAN_PROG = """
import numpy as np
import pprobe

a = np.array([1.0, 2.0, 0.0])
np.seterr(all="ignore")
for s in range(4):
    pprobe.step(s)
    b = np.multiply(a, 2.0)
    if s >= 2:
        c = np.divide(b, a)  # 0/0: the first NaN
        np.sum(c)
"""

COMPARE_PROG = """
import sys
import numpy as np
import pprobe

scale = float(sys.argv[1])
x = np.linspace(-1.0, 1.0, 16)
for s in range(4):
    pprobe.step(s)
    y = np.multiply(x, scale if s == 2 else 1.0)
    z = np.tanh(y)
    np.sum(z)
"""

TORCH_PROG = """
import torch
import pprobe

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 4)
y = torch.randn(16, 2)
for s in range(3):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
print("MODULES", [n for n, _ in model.named_modules() if n])
"""


# ------------------------------------------------------------------ runs (made once)
@pytest.fixture(scope="module")
def numpy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("np")
    return run_script(tmp, NUMPY_PROG).check().run_dir


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("nan")
    return run_script(tmp, NAN_PROG, env={"PPROBE_MODE": "stats"}).check().run_dir


@pytest.fixture(scope="module")
def compare_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """Runs A (scale 1), A' (the same again) and B (step 2's multiply scaled by 1.5)."""
    out = []
    for name, scale in (("a", "1.0"), ("a2", "1.0"), ("b", "1.5")):
        tmp = tmp_path_factory.mktemp(name)
        out.append(
            run_script(tmp, COMPARE_PROG, scale, env={"PPROBE_MODE": "stats"}).check().run_dir
        )
    return out[0], out[1], out[2]


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("torch")
    r = run_script(tmp, TORCH_PROG, env={"PPROBE_MODE": "stats"}, timeout=300).check()
    line = next(x for x in r.out.splitlines() if x.startswith("MODULES "))
    return r.run_dir, json.loads(line.split(" ", 1)[1].replace("'", '"'))


# ------------------------------------------------------------------ Chromium
def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium; .ci/run does)")
    return exe


_FLAGS = (
    "--headless",
    "--no-sandbox",  # tests run as root in CI containers
    "--disable-gpu",
    "--hide-scrollbars",
    "--no-first-run",
    "--disable-background-networking",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # a request could not reach anything
)


def _console(stderr: str) -> list[str]:
    """Console messages Chromium printed with --enable-logging=stderr (any level)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def dump_dom(url: str, home: Path) -> str:
    """The DOM after the page's script ran; fails on any console message."""
    p = subprocess.run(
        [_chromium(), *_FLAGS, "--enable-logging=stderr", "--v=0", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(HOME=str(home)),  # chromium writes its profile under $HOME
    )
    assert p.returncode == 0, p.stderr
    assert _console(p.stderr) == [], _console(p.stderr)
    return p.stdout


def open_page(html: Path, name: str) -> tuple[str, Path]:
    """The DOM after the page's script ran, and a screenshot; fails on console messages."""
    exe = _chromium()
    url = html.resolve().as_uri()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    png = ARTIFACTS / f"{name}.png"
    png.unlink(missing_ok=True)
    dom = dump_dom(url, html.parent)
    env = clean_env(HOME=str(html.parent))
    shot = subprocess.run(
        [exe, *_FLAGS, "--window-size=1280,2400", f"--screenshot={png}", url],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert shot.returncode == 0 and png.is_file(), shot.stderr
    return dom, png


def decode_png(path: Path) -> tuple[int, int, int, bytes]:
    """(width, height, channels, raw pixel bytes) of an 8-bit, non-interlaced RGB/RGBA PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", 0
    h = ch = 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and colour in (2, 6), (depth, colour)
            ch = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride = zlib.decompress(idat), w * ch
    out = bytearray()
    prev = bytearray(stride)
    for y in range(h):
        f, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - ch] if i >= ch else 0
            b, c = prev[i], prev[i - ch] if i >= ch else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += line
        prev = line
    return w, h, ch, bytes(out)


def pixels(png: Path) -> tuple[int, int, int, bytes]:
    """Pillow where it is installed (fast), else the pure-Python :func:`decode_png`."""
    try:
        from PIL import Image
    except ImportError:
        return decode_png(png)
    with Image.open(png) as im:
        rgb = im.convert("RGB")
        return rgb.size[0], rgb.size[1], 3, rgb.tobytes()


def assert_not_blank(png: Path) -> None:
    w, h, ch, px = pixels(png)
    grey = px[0::ch][::7]  # the red channel of every 7th pixel is enough
    mean = sum(grey) / len(grey)
    var = sum((v - mean) ** 2 for v in grey) / len(grey)
    distinct = len(set(px[i : i + 3] for i in range(0, len(px), ch * 97)))
    assert var > 100 and distinct > 20, (png, var, distinct)


def section(dom: str, sid: str) -> str:
    m = re.search(rf'<section id="{sid}">(.*?)</section>', dom, re.S)
    assert m, f"section {sid} missing"
    return m.group(1)


def check_page(html: Path, name: str, sections: tuple[str, ...] = SECTIONS) -> str:
    text = html.read_text()
    # self-contained: no external script, style, image or font
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text)
    assert "<link" not in text
    dom, png = open_page(html, name)
    assert re.search(r'<body[^>]*data-ready="[0-9.]+"', dom), "the page's script did not run"
    assert not re.search(r"<body[^>]*data-errors=", dom), "the page's script raised"
    for sid in sections:
        body = section(dom, sid)
        assert re.sub(r"<[^>]+>", "", body).strip(), f"section {sid} is empty"
    assert_not_blank(png)
    return dom


def make(run: Path, tmp: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    html = tmp / "report.html"
    p = subprocess.run(
        [sys.executable, "-m", "pprobe", "report", str(run), "-o", str(html), *extra],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    return p, html


# ------------------------------------------------------------------ data (in-process)
def test_numpy_run_figures(numpy_run: Path) -> None:
    d = report.collect(str(numpy_run))
    ov = d["overview"]
    assert ov["steps"] == 5 and (ov["step_min"], ov["step_max"]) == (0, 4)
    calls = {r["name"]: r["calls"] for r in d["by_op"]["rows"]}
    assert calls["numpy.multiply"] == calls["numpy.add"] == calls["numpy.sum"] == 5
    assert sum(calls.values()) == ov["op_rows"]
    bins = {b["step_lo"]: b for b in d["timeline"]["bins"]}
    assert [bins[s]["calls"] for s in (1, 2, 3, 4)] == [3, 3, 3, 3]
    assert d["timeline"]["width"] == 1
    hm = d["heatmap"]
    assert hm["by"] == "op" and hm["bins"] == 5
    row = hm["names"].index("numpy.multiply")
    cells = {c[1]: c for c in hm["cells"] if c[0] == row}
    x = [float(v) for v in range(1, 9)]
    for s in range(5):
        vals = [v * (s + 1) for v in x]
        mean = sum(vals) / 8
        std = (sum((v - mean) ** 2 for v in vals) / 8) ** 0.5
        assert cells[s][2] == pytest.approx(8.0 * (s + 1))
        assert cells[s][3] == pytest.approx(std)
        assert cells[s][4] == cells[s][5] == 0
    assert d["alerts"]["first"] is None
    # dump mode: one .npy file per dumped array (hard links included)
    assert d["dumps"]["dumped"] == len(npy_files(numpy_run)) > 0
    assert (
        d["dumps"]["bytes_written"]
        == json.loads((numpy_run / "meta.json").read_text())["dumps"]["bytes_written"]
    )


def test_nan_origin(nan_run: Path) -> None:
    d = report.collect(str(nan_run))
    f = d["alerts"]["first"]
    line = (
        NAN_PROG.splitlines().index(  # written as is: line 1 is the empty line after the quotes
            "        c = np.divide(b, a)  # 0/0: the first NaN"
        )
        + 1
    )
    assert f["op"] == "numpy.divide" and f["step"] == 2
    assert f["caller"].endswith(f"prog.py:{line}")
    assert f["nan_count"] == 1 and f["inf_count"] == 0
    assert all(not (i["nan_count"] or i["inf_count"]) for i in f["inputs"])
    assert f["source"]["line"] == line
    assert any("np.divide(b, a)" in t for i, t in f["source"]["lines"] if i == line)
    ops = [r["op"] for r in d["alerts"]["by_op"]]
    assert ops[0] == "numpy.divide" and "numpy.sum" in ops
    by = {r["op"]: r for r in d["alerts"]["by_op"]}
    assert by["numpy.divide"]["outputs"] == 2  # steps 2 and 3
    # heatmap cells of numpy.divide at steps 2 and 3 are marked
    hm = d["heatmap"]
    row = hm["names"].index("numpy.divide")
    assert sorted(c[1] for c in hm["cells"] if c[0] == row and c[4]) == [2, 3]
    bad = [b["step_lo"] for b in d["timeline"]["bins"] if b["bad_calls"]]
    assert bad == [2, 3]
    html = render(d)
    assert 'href="#first-bad"' in html and 'id="first-bad"' in html
    assert "np.divide(b, a)" in html


def test_compare_runs(compare_runs: tuple[Path, Path, Path]) -> None:
    a, a2, b = compare_runs
    same = report.collect(str(a), str(a2))["compare"]
    assert same["kind"] == "runs" and same["first"] is None
    assert set(same["counts"]) == {"equal"}
    diff = report.collect(str(a), str(b))["compare"]
    first = diff["first"]
    assert (first["op"], first["step"], first["occ"]) == ("numpy.multiply", 2, 0)
    # max |y| is 1 vs 1.5 (x spans [-1, 1]): relative difference 1/3
    assert first["score"] == pytest.approx(1 / 3)
    assert first["severity"] == "medium"
    sev = {(r["op"], r["step"]): r["severity"] for r in diff["rows"]}
    assert sev[("numpy.multiply", 1)] == "equal"
    assert sev[("numpy.tanh", 2)] in ("medium", "high")
    assert diff["counts"].get("only A", 0) == diff["counts"].get("only B", 0) == 0


def test_compare_saved_folder(numpy_run: Path, tmp_path: Path) -> None:
    """The hook for ``pprobe compare --save DIR``: its ``compare`` Parquet shown as a table."""
    import duckdb

    saved = tmp_path / "cmp"
    saved.mkdir()
    duckdb.sql(
        "COPY (SELECT * FROM (VALUES ('numpy.add', 'high', 0.9), ('numpy.sum', 'low', 1e-7)) "
        f"t(op, severity, max_rel_err)) TO '{saved / 'compare.parquet'}' (FORMAT parquet)"
    )
    c = report.collect(str(numpy_run), str(saved))["compare"]
    assert c["kind"] == "saved" and c["total"] == 2
    assert c["columns"] == ["op", "severity", "max_rel_err"]
    html = render(report.collect(str(numpy_run), str(saved)))
    assert "numpy.add" in section(html, "compare") and "#f8c9c9" in section(html, "compare")


def test_a_real_pprobe_compare_folder(
    compare_runs: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """``pprobe compare A B --save DIR`` then ``pprobe report B --compare DIR``: the first
    divergence (step 2's multiply) is named, and the failing pairs come first, coloured."""
    a, _, b = compare_runs
    saved = tmp_path / "cmp"
    r = subprocess.run(
        [sys.executable, "-m", "pprobe", "compare", str(a), str(b), "--save", str(saved)],
        capture_output=True,
        text=True,
        env=clean_env(PYTHONPATH=str(REPO)),
    )
    assert r.returncode == 1, r.stderr  # divergent
    c = report.collect(str(b), str(saved))["compare"]
    assert c["kind"] == "saved" and c["verdicts"]["fail"] >= 1
    first = dict(zip(c["columns"], c["rows"][0]))
    assert first["first_divergence"] and first["op"] == "numpy.multiply" and first["step"] == 2
    html = section(render(report.collect(str(b), str(saved))), "compare")
    assert "First divergence: numpy.multiply at step 2" in html
    assert html.index("#f8c9c9") < html.index('<tr style="background:">')  # fails first


def test_torch_modules(torch_run: tuple[Path, list[str]]) -> None:
    run, modules = torch_run
    d = report.collect(str(run))
    hm = d["heatmap"]
    assert hm["by"] == "module" and hm["cells"]
    paths = [r["name"] for r in d["by_module"]["rows"] if r["name"]]
    assert paths and all(p.split(".")[-1] in modules for p in paths), (paths, modules)
    assert all(n.split(".")[-1] in modules for n in hm["names"])
    assert sum(r["calls"] for r in d["by_module"]["rows"]) == d["overview"]["op_rows"]
    assert d["overview"]["steps"] >= 3


def test_empty_and_log_mode_runs(tmp_path: Path) -> None:
    """A run without rows and a log-mode run (no statistics) still give a page that says so."""
    empty = run_script(tmp_path / "e", "print('no ops')").check().run_dir
    d = report.collect(str(empty))
    assert d["overview"]["op_rows"] == 0 and d["heatmap"]["cells"] == []
    assert "This run recorded no op rows" in render(d)
    log = (
        run_script(
            tmp_path / "l",
            "import numpy as np\nnp.add(np.ones(3), 1)\n",
            env={"PPROBE_MODE": "log"},
        )
        .check()
        .run_dir
    )
    d = report.collect(str(log))
    assert {r["name"] for r in d["by_op"]["rows"]} >= {"numpy.add"}
    page = render(d)
    assert "log mode records none" in section(page, "heatmap")
    assert "this run has no statistics" in section(page, "alerts")
    assert "recorded in log mode" in section(page, "dumps")


def test_bounded_size() -> None:
    """The page's marks are bounded whatever the run's size: steps are binned."""
    assert report._bin_width(0, 10_000_000 - 1) == -(-10_000_000 // report.MAX_BINS)
    assert (10_000_000 - 1) // report._bin_width(0, 10_000_000 - 1) + 1 <= report.MAX_BINS
    assert report._bin_width(5, 5) == 1


# ------------------------------------------------------------------ command line
def test_cli_writes_page_and_line(numpy_run: Path, tmp_path: Path) -> None:
    p, html = make(numpy_run, tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"pprobe report: wrote {html}")  # plain text when piped
    assert "\x1b[" not in p.stdout
    assert html.stat().st_size > 10_000


def test_cli_json(numpy_run: Path, tmp_path: Path) -> None:
    p, html = make(numpy_run, tmp_path, "--format", "json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["output"] == str(html) and d["bytes"] == html.stat().st_size
    assert set(SECTIONS[1:]) - {"by_op", "by_module"} <= set(d)
    assert {"overview", "by_op", "by_module", "timeline", "heatmap", "alerts", "dumps"} <= set(d)


@pytest.mark.parametrize(
    "args, msg",
    [
        (["/nonexistent/run"], "pprobe report: no pprobe run found at /nonexistent/run"),
        (["RUN", "--compare", "/nonexistent/b"], "pprobe report: --compare: no pprobe run found"),
    ],
)
def test_cli_bad_run(numpy_run: Path, tmp_path: Path, args: list[str], msg: str) -> None:
    args = [str(numpy_run) if a == "RUN" else a for a in args]
    p = subprocess.run(
        [sys.executable, "-m", "pprobe", "report", *args, "-o", str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert p.returncode == 2
    assert p.stderr.startswith(msg) and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "r.html").exists()


def test_cli_usage_error() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "pprobe", "report", "--format", "xml"],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert p.returncode == 2 and "invalid choice: 'xml'" in p.stderr


# ------------------------------------------------------------------ in the browser
def test_browser_numpy(numpy_run: Path, tmp_path: Path) -> None:
    p, html = make(numpy_run, tmp_path)
    assert p.returncode == 0, p.stderr
    dom = check_page(html, "numpy")
    assert "numpy.multiply" in section(dom, "by_op")
    assert "No output holds NaN or inf" in section(dom, "alerts")
    # the page's script: #std colours every cell by its std
    cells = re.findall(r'<rect [^>]*fill="([^"]+)" data-a="([^"]+)" data-s="([^"]+)"', dom)
    assert cells and all(f == a for f, a, _ in cells)
    std = dump_dom(html.resolve().as_uri() + "#std", tmp_path)
    cells = re.findall(r'<rect [^>]*fill="([^"]+)" data-a="([^"]+)" data-s="([^"]+)"', std)
    assert cells and all(f == s for f, _, s in cells) and any(a != s for _, a, s in cells)


def test_browser_torch(torch_run: tuple[Path, list[str]], tmp_path: Path) -> None:
    p, html = make(torch_run[0], tmp_path)
    assert p.returncode == 0, p.stderr
    dom = check_page(html, "torch")
    assert "module (torch nn.Module path)" in section(dom, "heatmap")


def test_browser_nan(nan_run: Path, tmp_path: Path) -> None:
    p, html = make(nan_run, tmp_path)
    assert p.returncode == 0, p.stderr
    dom = check_page(html, "nan")
    assert "Jump to the origin" in dom
    assert "numpy.divide" in section(dom, "alerts")
    assert 'class="bad"' in section(dom, "heatmap")


def test_browser_compare(compare_runs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    a, _, b = compare_runs
    p, html = make(a, tmp_path, "--compare", str(b))
    assert p.returncode == 0, p.stderr
    dom = check_page(html, "compare", SECTIONS + ("compare",))
    assert "First divergence: numpy.multiply at step 2" in section(dom, "compare")


def test_png_decoder(tmp_path: Path) -> None:
    """The test's PNG reader against a PNG written here, and against Pillow where it is
    installed on a Chromium screenshot (whose rows use every PNG filter)."""
    w, h = 5, 3
    lines = [
        bytes(v for x in range(w) for v in (x * 40 + y, y * 70, 200 - x * 10)) for y in range(h)
    ]
    raw = b"".join(b"\x00" + r for r in lines)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    png = tmp_path / "t.png"
    png.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )
    assert decode_png(png) == (w, h, 3, b"".join(lines))
    shot = ARTIFACTS / "numpy.png"
    Image = pytest.importorskip("PIL.Image")
    if not shot.is_file():
        pytest.skip("no screenshot to cross-check (test_browser_numpy did not run)")
    w, h, ch, px = decode_png(shot)
    with Image.open(shot) as im:
        assert im.size == (w, h)
        assert im.convert("RGBA" if ch == 4 else "RGB").tobytes() == px
