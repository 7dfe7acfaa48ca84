"""The interactive reader, checked in a real browser: `make lab`, opened in headless Chromium.

Starts `make lab` on a free local port (with a throw-away Jupyter home, so that no setting of this
machine's user counts), opens chapters in the system's Chromium driven by Playwright, and asserts
what a reader sees:

- every Markdown cell rendered by jupyterlab-myst: no raw ``{math}``, ``:label:``, ``{eq}``,
  ``{doc}``, ``{literalinclude}`` or ``:pyobject:`` text; one rendered display equation (KaTeX)
  per ``{math}`` block, numbered when labelled;
- the code each "Where is this in the code" section promises: the source of every object its
  ``show_source`` cells name, read from tformer now, is on the page;
- no error output; the notebooks were trusted at start (no "not trusted" in the server's log);
- the lab's settings as shipped: autosave off, no news;
- one chapter run top to bottom (Run All Cells): no error, its figures drawn, and a live progress
  widget that reached its last step;
- afterwards ``git status`` is what it was before: the lab wrote nothing into the repository.

    python tools/browser_check.py [--chapters 01 04 13 14] [--run 10] [--screenshots DIR]
    python tools/browser_check.py --brief    # prints "skipped: <why>" where it cannot run

Chromium: $CHROMIUM, else `chromium` or `chromium-browser` on PATH (Debian: apt-get install
chromium). Playwright's own browser download is never used.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TOKEN = "browser-check"
# The notebook in the visible tab (the lab keeps earlier tabs open, hidden).
NB = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook"
RAW_MYST = ("{math}", ":label:", "{eq}", "{doc}", "{cite}", "{literalinclude}", ":pyobject:")
# Variables that the test targets set and a reader's shell does not: the lab must run without them.
TEST_ONLY_ENV = ("TFORMER_PROGRESS", "TFORMER_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                 "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")


def find_chromium():
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def why_skip():
    """A one-line reason why the check cannot run here, or None."""
    if find_chromium() is None:
        return ("skipped: no Chromium on this machine (Debian: apt-get install chromium; or set "
                "CHROMIUM=/path/to/chrome)")
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def git_status():
    try:
        return subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


class Lab:
    """`make lab` on a free port, in its own process group, with a fresh Jupyter home."""

    def __init__(self, home):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(home) / "lab.log"
        env = {k: v for k, v in os.environ.items() if k not in TEST_ONLY_ENV}
        for var, sub in [("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                         ("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython"),
                         ("JUPYTERLAB_SETTINGS_DIR", "user-settings"),
                         ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")]:
            env[var] = str(Path(home) / sub)
        # The one setting of the check's own: every cell in the DOM (JupyterLab otherwise attaches
        # only the cells near the viewport), so that the whole chapter can be read at once.
        tracker = Path(home, "user-settings", "@jupyterlab", "notebook-extension")
        tracker.mkdir(parents=True)
        (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}\n')
        flags = f"--no-browser --ServerApp.ip=127.0.0.1 --IdentityProvider.token={TOKEN}"
        self.log = open(self.log_path, "w")
        self.start = time.perf_counter()
        self.proc = subprocess.Popen(
            ["make", "--no-print-directory", "lab", f"LAB_PORT={self.port}", f"LAB_FLAGS={flags}"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout=180):
        while time.perf_counter() - self.start < timeout:
            if self.proc.poll() is not None:
                raise AssertionError(f"make lab exited with {self.proc.returncode}:\n{self.text()}")
            try:
                get_json(f"{self.base}/api/status?token={TOKEN}", timeout=2)
                return time.perf_counter() - self.start
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"the lab did not answer within {timeout} s:\n{self.text()}")

    def text(self):
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def check_settings(lab):
    """The settings in force: the user's own value, else the default as lab/settings overrides it."""
    def effective(plugin, key):
        got = get_json(f"{lab.base}/lab/api/settings/{plugin}?token={TOKEN}")
        return got["settings"].get(key, got["schema"]["properties"][key].get("default"))
    autosave = effective("@jupyterlab/docmanager-extension:plugin", "autosave")
    assert autosave is False, f"autosave: expected false, got {autosave}"
    news = "@jupyterlab/apputils-extension:notification"
    assert effective(news, "fetchNews") == "false", "fetchNews: expected 'false'"
    assert effective(news, "checkForUpdates") is False, "checkForUpdates: expected false"


def notebook_facts(path):
    """What the file promises: {math} blocks, labelled ones, show_source names, figures."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    md = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    text = "\n".join(md)
    names = [n for src in code if "show_source(" in src
             for n in re.findall(r'"(tformer\.[\w.]+)"', src)]
    figures = sum("image/png" in o.get("data", {}) for c in nb["cells"] if c["cell_type"] == "code"
                  for o in c["outputs"])
    return {"markdown_cells": len(md), "math": len(re.findall(r"^```+\{math\}", text, re.M)),
            "labels": len(re.findall(r"^:label:", text, re.M)),
            "eq_refs": len(re.findall(r"\{eq\}`", text)), "names": names, "figures": figures,
            "code_cells": len(code),
            "includes": len(re.findall(r"^```+\{literalinclude\}", text, re.M)),
            "doc_targets": set(re.findall(r"\{doc\}`(?:[^`<]*<)?([^`<>]+?)>?`", text))}


def squash(s):
    return re.sub(r"\s+", "", s)


def open_chapter(page, lab, rel):
    page.goto(f"{lab.base}/lab/tree/{rel}?reset&token={TOKEN}")      # reset: no earlier tabs
    page.wait_for_selector(f"{NB} .jp-MarkdownCell", timeout=60_000)
    page.wait_for_function(
        f"() => document.querySelectorAll('{NB} .jp-MarkdownCell .myst')"
        f".length > 0 && [...document.querySelectorAll('{NB} .jp-MarkdownCell')]"
        ".every(c => c.querySelector('.myst'))", timeout=60_000)
    page.wait_for_timeout(1500)                     # KaTeX and the output renderers settle


def check_chapter(page, lab, rel, facts):
    assert facts["includes"] == 0, (
        f"{rel}: {facts['includes']} {{literalinclude}} block(s), which the lab renders as nothing: "
        f"python tools/source_cells.py {rel} turns them into show_source cells")
    md = page.locator(f"{NB} .jp-MarkdownCell .myst")
    assert md.count() == facts["markdown_cells"], \
        f"{rel}: {md.count()} rendered Markdown cells, expected {facts['markdown_cells']}"
    md_text = "\n".join(md.all_inner_texts())
    raw = [s for s in RAW_MYST if s in md_text]
    assert not raw, f"{rel}: raw MyST in the rendered Markdown: {raw}"
    displays = page.locator(f"{NB} .jp-MarkdownCell .katex-display").count()
    assert displays >= facts["math"], \
        f"{rel}: {displays} rendered display equations, expected at least {facts['math']}"
    numbered = page.evaluate(
        f"() => [...document.querySelectorAll('{NB} .jp-MarkdownCell .katex-display')]"
        ".filter(e => /\\(\\d+\\)/.test((e.closest('.group') || e.parentElement).innerText)).length")
    assert numbered >= facts["labels"], \
        f"{rel}: {numbered} numbered equations, expected {facts['labels']} (one per :label:)"
    links = page.locator(f"{NB} .jp-MarkdownCell a").all_inner_texts()
    eq_links = sum(bool(re.fullmatch(r"\(\d+\)", t.strip())) for t in links)
    assert eq_links >= facts["eq_refs"], \
        f"{rel}: {eq_links} equation references rendered as (n) links, expected {facts['eq_refs']}"
    bare = sorted({t.strip() for t in links} & facts["doc_targets"])
    assert not bare, f"{rel}: {{doc}} references shown as bare paths: {bare}"
    page_code = squash(page.locator(f"{NB}").inner_text())
    from tformer.core.source import source_of
    missing = [n for n in facts["names"] if squash(source_of(n)[1]) not in page_code]
    assert not missing, f"{rel}: the source of {missing} is not on the page"
    check_no_errors(page, rel)
    return {"display_math": displays, "numbered": numbered, "eq_links": eq_links,
            "sources": len(facts["names"])}


def check_no_errors(page, rel):
    errors = page.locator(f"{NB} [data-mime-type='application/vnd.jupyter.stderr']")
    texts = [t for t in errors.all_inner_texts() if re.search(r"Error|Traceback", t)]
    assert not texts, f"{rel}: error output on the page: {texts[0][:300]}"


def run_chapter(page, lab, rel, facts, timeout):
    """Run All Cells; wait until every code cell has an execution count; check what shows."""
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle'], "
                           "[title*='Kernel status: Idle'], .jp-KernelStatus-success",
                           timeout=60_000, state="attached")
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    start = time.perf_counter()
    saw_live_bar = False
    while time.perf_counter() - start < timeout:
        prompts = page.locator(f"{NB} .jp-CodeCell .jp-InputPrompt").all_inner_texts()
        bars = page.locator(f"{NB} .widget-hprogress, {NB} .widget-progress")
        saw_live_bar = saw_live_bar or bars.count() > 0
        done = [p for p in prompts if re.fullmatch(r"\[\d+\]:", p.strip())]
        if len(done) == facts["code_cells"] and not any("*" in p for p in prompts):
            break
        page.wait_for_timeout(500)
    else:
        page.screenshot(path=str(Path(tempfile.gettempdir()) / "browser-check-timeout.png"))
        raise AssertionError(f"{rel}: Run All did not finish within {timeout} s; prompts: "
                             f"{' '.join(p.strip() for p in prompts)}; screenshot in "
                             f"{tempfile.gettempdir()}/browser-check-timeout.png")
    seconds = time.perf_counter() - start
    page.wait_for_timeout(1000)
    check_no_errors(page, rel)
    errors = page.locator(f"{NB} .jp-OutputArea-output[data-mime-type="
                          "'application/vnd.jupyter.stderr'] >> text=/Traceback/")
    assert errors.count() == 0, f"{rel}: a cell raised"
    images = page.locator(f"{NB} .jp-OutputArea-output img").count()
    assert images >= facts["figures"], f"{rel}: {images} figures drawn, expected {facts['figures']}"
    bars = page.locator(f"{NB} .widget-hprogress")
    assert saw_live_bar and bars.count() > 0, f"{rel}: no progress widget appeared"
    holders = page.locator(f"{NB} .jp-OutputArea-output", has=page.locator(".widget-hprogress"))
    labels = " ".join(holders.all_inner_texts())
    finished = re.findall(r"(\d+)/(\d+)", labels)
    assert finished and all(a == b for a, b in finished), \
        f"{rel}: the progress widget did not reach its last step: {labels!r}"
    return {"seconds": seconds, "bars": bars.count(), "figures": images}


def screenshot(page, directory, stem):
    directory.mkdir(parents=True, exist_ok=True)
    page.locator(f"{NB}").evaluate("e => e.scrollTo(0, 0)")
    page.wait_for_timeout(300)
    page.screenshot(path=str(directory / f"{stem}-top.png"))
    heading = page.locator(f"{NB} .jp-MarkdownCell h2", has_text="Where is this in the code")
    if heading.count():
        heading.first.scroll_into_view_if_needed()
        page.wait_for_timeout(300)
        page.screenshot(path=str(directory / f"{stem}-code.png"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--brief", action="store_true", help="print why it would skip, then exit")
    ap.add_argument("--chapters", nargs="+", default=["01", "04", "13", "14"])
    ap.add_argument("--run", default="10", help="the chapter to run top to bottom ('' for none)")
    ap.add_argument("--run-timeout", type=float, default=120)
    ap.add_argument("--screenshots", type=Path, help="write PNGs of each chapter here")
    args = ap.parse_args(argv)
    reason = why_skip()
    if args.brief or reason:
        if reason:
            print(reason)
        return 0
    from playwright.sync_api import sync_playwright

    paths = {}
    for ch in sorted(set(args.chapters) | ({args.run} if args.run else set())):
        found = sorted((ROOT / "notebooks").glob(f"{ch}_*.ipynb"))
        if len(found) != 1:
            raise SystemExit(f"--chapters: expected one notebook named {ch}_*.ipynb, got {found}")
        paths[ch] = found[0]
    before = git_status()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tformer-lab-") as home:
        lab = Lab(home)
        try:
            ready = lab.wait_ready()
            print(f"lab: answering on 127.0.0.1:{lab.port} after {ready:.1f}s", flush=True)
            check_settings(lab)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=find_chromium(),
                                            args=["--no-sandbox", "--disable-dev-shm-usage"])
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                for ch in args.chapters:
                    rel = paths[ch].relative_to(ROOT).as_posix()
                    start = time.perf_counter()
                    open_chapter(page, lab, rel)
                    got = check_chapter(page, lab, rel, notebook_facts(paths[ch]))
                    if args.screenshots:
                        screenshot(page, args.screenshots, paths[ch].stem)
                    print(f"{rel}: rendered in {time.perf_counter() - start:.1f}s; "
                          f"{got['display_math']} display equations ({got['numbered']} numbered), "
                          f"{got['eq_links']} equation links, {got['sources']} sources shown",
                          flush=True)
                if args.run:
                    rel = paths[args.run].relative_to(ROOT).as_posix()
                    facts = notebook_facts(paths[args.run])
                    open_chapter(page, lab, rel)
                    got = run_chapter(page, lab, rel, facts, args.run_timeout)
                    if args.screenshots:
                        page.locator(f"{NB} .widget-hprogress").first.scroll_into_view_if_needed()
                        page.wait_for_timeout(300)
                        page.screenshot(path=str(args.screenshots / f"{paths[args.run].stem}-run.png"))
                    print(f"{rel}: ran in {got['seconds']:.1f}s with no error; {got['figures']} "
                          f"figures, {got['bars']} progress widget(s) at their last step", flush=True)
                browser.close()
            untrusted = [ln for ln in lab.text().splitlines() if "not trusted" in ln]
            assert not untrusted, f"the lab did not trust the notebooks: {untrusted[0]}"
        finally:
            lab.stop()
    after = git_status()
    assert before == after, f"the lab changed the repository:\nbefore:\n{before}\nafter:\n{after}"
    print(f"browser check: passed in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
