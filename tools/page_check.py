"""Every page of the built book, in headless Chromium at a 1280-pixel window: nothing overflows.

    python tools/page_check.py [_build/html] [--width 1280] [--screenshots DIR] [--only PATTERN]
    python tools/page_check.py --brief      # prints "skipped: <why>" where it cannot run

Each page is opened from the file system (no server, nothing downloaded), its math typeset by the
site's own MathJax (and a display equation up to 18 % too wide set smaller by
``_static/fit_math.js``), its collapsed blocks (solutions) opened, and then measured:

- the page itself must not scroll sideways (the document's ``scrollWidth`` ≤ its width);
- no element of the article may have a horizontal scrollbar (``overflow-x: auto|scroll`` and a
  ``scrollWidth`` above its ``clientWidth``): a code cell, an output, a table, a display equation;
- no element may stick out past the article's right edge.

A failure names the page, the element (a code cell, an output, ``mjx-container`` for an equation,
...) and its first characters. Exit status 1 if any page overflows. ``--screenshots DIR`` keeps a
full-page PNG of each page. Chromium: $CHROMIUM, else ``chromium`` or ``chromium-browser`` on
PATH, driven by Playwright (``requirements-lab.txt``); Playwright's own browser download is never used.
"""
import argparse
import fnmatch
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from browser_check import find_chromium, why_skip  # noqa: E402

# Runs in the page: open collapsed blocks, then list what overflows. Inside a <pre>, an equation
# or a picture only the element itself is measured (its spans and glyphs are not blocks).
MEASURE = """() => {
  for (const el of document.querySelectorAll('.toggle-hidden')) el.classList.remove('toggle-hidden');
  for (const el of document.querySelectorAll('details')) el.open = true;
  const found = [];
  const doc = document.scrollingElement;
  if (doc.scrollWidth > doc.clientWidth + 1)
    found.push({what: 'the page', scroll: doc.scrollWidth, width: doc.clientWidth, text: ''});
  const art = document.querySelector('article.bd-article') || document.querySelector('article');
  if (!art) return found;
  const edge = art.getBoundingClientRect().right - parseFloat(getComputedStyle(art).paddingRight);
  const leaves = new Set(['PRE', 'MJX-CONTAINER', 'svg', 'IMG', 'TABLE']);
  const walk = (el) => {
    for (const child of el.children) {
      const st = getComputedStyle(child);
      if (st.display === 'none') continue;
      const box = child.getBoundingClientRect();
      const scrolls = (st.overflowX === 'auto' || st.overflowX === 'scroll')
        && child.scrollWidth > child.clientWidth + 1;
      const sticks = st.display !== 'inline' && box.width > 0 && box.right > edge + 1;
      if (scrolls || sticks) {
        const cell = child.closest('.cell');
        const where = cell ? (child.closest('.cell_output') ? 'output' : 'code cell') : '';
        found.push({what: (where ? where + ' ' : '') + child.tagName.toLowerCase()
                      + (child.className && typeof child.className === 'string'
                         ? '.' + child.className.split(' ')[0] : ''),
                    scroll: scrolls ? child.scrollWidth : Math.round(box.right),
                    width: scrolls ? child.clientWidth : Math.round(edge),
                    text: (child.innerText || child.textContent || '').replace(/\\s+/g, ' ').slice(0, 70)});
        continue;                                   // report the outermost element only
      }
      if (!leaves.has(child.tagName)) walk(child);
    }
  };
  walk(art);
  return found;
}"""


def pages_of(site, only=None):
    site = Path(site).resolve()
    # a redirect page (index.html -> the introduction) has nothing to measure
    pages = sorted(p for p in site.rglob("*.html")
                   if p.relative_to(site).parts[0] not in ("_static", "_sources")
                   and 'http-equiv="Refresh"' not in p.read_text(encoding="utf-8", errors="replace")[:2000])
    if only:
        pages = [p for p in pages if fnmatch.fnmatch(p.relative_to(site).as_posix(), only)]
    return site, pages


def check(site, width=1280, screenshots=None, only=None):
    """A list of problems, and the number of pages measured."""
    from playwright.sync_api import sync_playwright
    site, pages = pages_of(site, only)
    problems = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": width, "height": 900})
        for path in pages:
            rel = path.relative_to(site).as_posix()
            page.goto(path.as_uri(), wait_until="load")
            # MathJax typesets after load; its startup promise resolves when the page is done
            page.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise"
                          " ? MathJax.startup.promise.then(() => true) : true")
            # _static/fit_math.js sets a slightly too wide equation in a smaller font, then says so
            page.wait_for_function("() => !window.MathJax"
                                   " || document.documentElement.dataset.mathFitted === 'yes'",
                                   timeout=20_000)
            for f in page.evaluate(MEASURE):
                problems.append(f"{rel}: {f['what']} is {f['scroll']} px wide in {f['width']} px: "
                                f"{f['text']!r}")
            if screenshots:
                out = Path(screenshots) / (rel.replace("/", "__").removesuffix(".html") + ".png")
                out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(out), full_page=True)
        browser.close()
    return problems, len(pages)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", nargs="?", default=str(ROOT / "_build" / "html"))
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--screenshots", metavar="DIR", help="keep a full-page PNG of each page")
    parser.add_argument("--only", metavar="PATTERN", help="pages matching a glob, e.g. 'notebooks/*'")
    parser.add_argument("--brief", action="store_true",
                        help="print 'skipped: <why>' if the check cannot run here, else nothing")
    args = parser.parse_args(argv)
    skip = why_skip()
    if args.brief:
        if skip:
            print(skip)
        return 0
    if skip:
        print(skip)
        return 0
    if not (Path(args.site) / "index.html").exists():
        print(f"page_check: no site at {args.site} (run `make book` first)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    problems, n = check(args.site, args.width, args.screenshots, args.only)
    for line in problems:
        print(line)
    print(f"page_check: {n} pages at {args.width} px, {len(problems)} overflowing element(s), "
          f"{time.perf_counter() - start:.0f} s")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
