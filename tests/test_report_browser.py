"""The Snakemake report in a real headless browser (Debian's Chromium, driven over the DevTools protocol).

The report is built by the workflow's own rules (`figures`, `report_tables`, then `snakemake --report`) on
the literal tables of tests/figure_fixtures.py; the browser then opens it as a reader would: the page
loads without console errors, every category is there, the claims table (clicked open from the Claims
category) has a verdict per claim, and every figure shown from its category decodes with non-blank
content, while a figure not drawn (a notice) is not shown. At 1400 px (a laptop) the landing page holds
the answer (the kinds table, the verdict counts linking to the claims table), the claims table fits
without a horizontal scrollbar with its statement column wide enough to read, and the forest plot's
labels are shown at >= 11 px. Screenshots go to
$COMPO_SCREENSHOTS (default: the test's tmp folder) for a person to look at.
Chromium comes from scripts/install-chromium.sh (scripts/test.sh runs it); without it the test skips.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from figure_fixtures import CLAIMS, EFFECTS, SEEDS, write_inputs
from workflow_runner import DEFAULT, snakemake

from compo.claims import control_sides, control_word
from compo.figures import FIGURES, FOREST_LABEL_PT, PNG_DPI

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# the flags this machine's closed network needs (no background requests, no first-run work)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--remote-debugging-port=0", "--window-size=1400,1000"]
WIDTH = 1400  # the reader's screen: every check below is at this width
STUDY = """
study:
  datasets: [coco]
  methods: [clip-ft, negclip, cement-none, cement]
  seeds: [0, 1, 2]
wiseft:
  methods: [negclip]
  alphas: [0.0, 0.5, 1.0]
claims: []  # the fixture's claims.csv stands in for the measured claims
"""
CATEGORIES = ["Claims", "Compositionality", "Data", "Multi-modal", "Training"]
# the one figure this study cannot draw (every method trains on coco alone): a notice, left out of the report
NOT_DRAWN = ("dataset_attributes", "Data", "Dataset attributes vs scores (figure)")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason="Chromium is not installed: run scripts/install-chromium.sh (as root) for the "
                              "browser test"),
]


# --- a minimal DevTools protocol client -------------------------------------------------------------
class Page:
    """One browser tab over the DevTools websocket: commands, events, console errors."""

    def __init__(self, ws: Any):
        self.ws = ws
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, timeout: float = 60, **params: Any) -> dict[str, Any]:
        command_id = next(self.ids)
        self.ws.send(json.dumps({"id": command_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == command_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def evaluate(self, expression: str, context: int | None = None) -> Any:
        params: dict[str, Any] = {"expression": expression, "awaitPromise": True, "returnByValue": True}
        if context is not None:
            params["contextId"] = context
        result = self.send("Runtime.evaluate", **params)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30, context: int | None = None) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression, context)
            if value:
                return value
            time.sleep(0.2)
        raise TimeoutError(f"waited {timeout} s for: {expression}")

    def console_errors(self) -> list[str]:
        errors = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
            elif method == "Runtime.exceptionThrown":
                errors.append(params["exceptionDetails"].get("exception", {}).get("description", str(params)))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                errors.append(params["entry"]["text"])
        return errors

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def frame_context(self, timeout: float = 30) -> int:
        """An execution context in the page's (only) iframe once its document has loaded."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            children = self.send("Page.getFrameTree")["frameTree"].get("childFrames", [])
            if children:
                frame = children[0]["frame"]["id"]
                try:
                    context = self.send("Page.createIsolatedWorld", frameId=frame)["executionContextId"]
                    if self.evaluate("document.readyState === 'complete' && !!document.querySelector('table')",
                                     context):
                        return context
                except RuntimeError as error:
                    # the iframe navigated between creating the world and evaluating in it: ask again
                    if "Cannot find context" not in str(error) and "No frame" not in str(error):
                        raise
            time.sleep(0.2)
        raise TimeoutError("the result's iframe did not load")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """The report of a small study built from the fixture tables by the workflow's own rules."""
    root = tmp_path_factory.mktemp("report")
    models = ["base-clip/pretrain/seed0"] + [f"{m}/coco/seed{s}" for m in ("clip-ft", "negclip", "cement-none",
                                                                             "cement") for s in SEEDS]
    write_inputs(root, models)
    (root / "study.yaml").write_text(STUDY)
    for extra in ([], ["--report", str(root / "report.html")]):
        run = snakemake(root, "figures", "report_tables", "--allowed-rules", "figures", "report_tables", *extra,
                        configs=[DEFAULT, root / "study.yaml"], cores=1)
        assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    return root / "report.html"


@pytest.fixture(scope="module")
def page(report, tmp_path_factory):
    from websockets.sync.client import connect

    profile = tmp_path_factory.mktemp("chromium-profile")
    process = subprocess.Popen([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Chromium did not start: {process.stderr.read()[-2000:] if process.stderr else ''}")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as response:
            target = next(t for t in json.load(response) if t["type"] == "page")
        with connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            tab = Page(ws)
            for domain in ("Runtime", "Log", "Page"):
                tab.send(f"{domain}.enable")
            tab.send("Emulation.setDeviceMetricsOverride", width=WIDTH, height=1000, deviceScaleFactor=1,
                     mobile=False)
            tab.send("Page.navigate", url=report.as_uri())
            tab.wait_for("document.readyState === 'complete' && typeof app !== 'undefined'", timeout=120)
            yield tab
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("COMPO_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def open_category(page: Page, category: str) -> None:
    """Back to the menu through the first breadcrumb (home), as a reader would, then the category."""
    page.evaluate("(() => { const home = document.querySelector('nav nav ol a'); if (home) home.click(); })()")
    assert page.wait_for(f"""(() => {{
        const link = [...document.querySelectorAll('nav a')].find(a => a.textContent.trim() === {json.dumps(category)});
        if (link) link.click();
        return !!link; }})()"""), f"no menu entry {category!r}"


def show_result(page: Page, label: str) -> None:
    """Click the view (eye) button of the result row labelled `label` in the open category."""
    assert page.wait_for(f"""(() => {{
        const row = [...document.querySelectorAll('nav tr')].find(
            tr => tr.cells.length && tr.cells[0].textContent.trim() === {json.dumps(label)});
        if (row) row.querySelector('a[type=button]').click();
        return !!row; }})()"""), f"no result {label!r}"


def result_labels(page: Page, category: str) -> list[str]:
    return page.evaluate(f"""Object.values(categories[{json.dumps(category)}]).flat()
        .map(path => results[path].labels.result)""")


IMAGE_CONTENT = """(async () => {
    const img = [...document.images].find(i => !i.closest('nav') && i.src.startsWith('data:image/png'));
    if (!img) return null;
    await img.decode();
    const canvas = document.createElement('canvas');
    canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
    const context = canvas.getContext('2d');
    context.drawImage(img, 0, 0);
    const pixels = context.getImageData(0, 0, canvas.width, canvas.height).data;
    const colours = new Set();
    let ink = 0;
    for (let i = 0; i < pixels.length; i += 4 * 7) {
        colours.add((pixels[i] << 16) | (pixels[i + 1] << 8) | pixels[i + 2]);
        if (pixels[i] + pixels[i + 1] + pixels[i + 2] < 600) ink += 1;
    }
    return {width: img.naturalWidth, height: img.naturalHeight, shown: img.clientWidth, colours: colours.size,
            ink: ink / (pixels.length / 28)};
})()"""


def test_report_loads_without_console_errors_with_every_category(page, screenshots):
    page.screenshot(screenshots / "0-landing.png")
    assert page.evaluate("Object.keys(categories).sort()") == CATEGORIES
    assert page.evaluate("document.body.innerText").count("compo-study") >= 1  # the workflow description
    assert page.console_errors() == []


def test_claims_table_opens_from_the_claims_category_with_a_verdict_per_claim(page, screenshots):
    open_category(page, "Claims")
    assert result_labels(page, "Claims") == ["Claims table", "Effects of the claims (forest plot)",
                                             "Results table (mean and 95 % CI over seeds)"]
    show_result(page, "Claims table")
    frame = page.frame_context()
    rows = page.evaluate("""[...document.querySelectorAll('table')[1].querySelectorAll('tbody tr')].map(
        tr => [tr.cells[0].textContent.trim(), tr.querySelector('td.verdict').textContent.trim()])""", frame)
    sides = control_sides(EFFECTS)  # a control reads passes / fails
    assert rows == [[c, control_word(sides.get(c) if r == "control" else None, v)]
                    for c, r, v in zip(CLAIMS["id"], CLAIMS["role"], CLAIMS["verdict"], strict=True)]
    # the kinds of effect open the page, in view: the fixture's binding fails its negative control
    kinds = page.evaluate("""(() => { const t = document.querySelectorAll('table')[0];
        return [t.innerText, t.getBoundingClientRect().top < window.innerHeight]; })()""", frame)
    assert "cannot detect effects of this kind: its negative control control-negative is reversed" in kinds[0]
    assert kinds[1]
    page.screenshot(screenshots / "1-claims-table.png")
    assert page.console_errors() == []


def test_every_figure_decodes_with_content(report, page, screenshots):
    shown = 0
    for category in CATEGORIES:
        open_category(page, category)
        for label in result_labels(page, category):
            path = page.evaluate(f"""Object.values(categories[{json.dumps(category)}]).flat()
                .find(p => results[p].labels.result === {json.dumps(label)})""")
            if not path.endswith(".png"):
                continue
            show_result(page, label)
            content = page.wait_for(IMAGE_CONTENT, timeout=30)
            assert content["width"] > 300 and content["height"] > 100, (label, content)
            assert content["colours"] > 20 and content["ink"] > 0.005, (label, content)
            page.screenshot(screenshots / f"2-{Path(path).stem}.png")
            shown += 1
    assert shown == len(FIGURES) - 1
    # the figure not drawn is written (a notice in the figures folder, its reason logged) but not shown
    name, category, label = NOT_DRAWN
    assert label not in result_labels(page, category)
    assert f"figure {name} not drawn" in (report.parent / "results" / "logs" / "figures.log").read_text()
    assert (report.parent / "results" / "figures" / f"{name}.png").exists()
    assert page.console_errors() == []


def test_landing_page_opens_on_the_kinds_and_the_verdict_counts(page, screenshots):
    page.evaluate("(() => { const home = document.querySelector('nav nav ol a'); if (home) home.click(); })()")
    landing = page.wait_for("""(() => {
        const table = [...document.querySelectorAll('table')].find(t => t.innerText.includes('kind of effect'));
        const counts = [...document.querySelectorAll('a')].filter(a => /^[0-9]+ /.test(a.textContent.trim())
            && a.href.startsWith('javascript:app.showResultInfo'));
        if (!table || !counts.length) return null;
        const box = table.getBoundingClientRect();
        return {rows: table.tBodies[0].rows.length, top: box.top, right: box.right, counts: counts.map(
            a => a.textContent.trim()), width: document.documentElement.scrollWidth};
    })()""")
    page.screenshot(screenshots / "0-landing-answer.png")
    assert landing["rows"] == len(EFFECTS) and landing["counts"] == ["2 passes", "1 reversed", "1 not detected"]
    assert 0 <= landing["top"] < 1000 and landing["right"] <= WIDTH and landing["width"] <= WIDTH, landing
    # a count opens the claims table's entry (Snakemake's result info, with its view button)
    page.evaluate("[...document.querySelectorAll('a')].find(a => a.textContent.trim() === '1 reversed').click()")
    assert page.wait_for("document.querySelector('nav').innerText.includes('claims.html')")
    assert page.console_errors() == []


def test_claims_table_is_readable_at_1400_px(page, screenshots):
    open_category(page, "Claims")
    show_result(page, "Claims table")
    frame = page.frame_context()
    sizes = page.evaluate("""(() => {
        const table = document.querySelector('table.claims');
        const heads = [...table.tHead.rows[0].cells].map(c => c.textContent.trim());
        const statement = table.tBodies[0].rows[0].cells[heads.indexOf('statement')].getBoundingClientRect();
        return {heads, statement: statement.width, tallest: Math.max(...[...table.tBodies[0].rows].map(
            r => r.getBoundingClientRect().height)), scroll: document.documentElement.scrollWidth,
            client: document.documentElement.clientWidth, frame: window.innerWidth};
    })()""", frame)
    page.screenshot(screenshots / "1-claims-1400.png")
    assert "why" not in sizes["heads"]  # no row has one: the column would only take width
    # the squeezed statement column made rows of 150-250 px; a wrapped statement takes up to four lines (80-84 px
    # by the frame's width when it is measured)
    assert sizes["statement"] >= 200 and sizes["tallest"] <= 100, sizes
    assert sizes["scroll"] <= sizes["client"], sizes  # no horizontal scrollbar


def test_forest_plot_labels_are_shown_at_a_readable_size(page, screenshots):
    open_category(page, "Claims")
    show_result(page, "Effects of the claims (forest plot)")
    content = page.wait_for(IMAGE_CONTENT, timeout=30)
    page.screenshot(screenshots / "2-forest-1400.png")
    shown_px = FOREST_LABEL_PT * PNG_DPI / 72 * content["shown"] / content["width"]
    assert shown_px >= 11, (shown_px, content)
