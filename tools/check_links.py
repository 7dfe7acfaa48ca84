"""Check the built site (_build/html) for links that lead nowhere. Exit status 1 if any does.

    python tools/check_links.py [_build/html]

Every page of the site is read, and for each one:

- every internal link (``href``/``src`` without a scheme: ``a``, ``link``, ``img``, ``script``)
  must name a file that exists in the site, and its ``#anchor``, if any, an ``id`` (or ``name``)
  in that file;
- every cross-reference to the API (``{py:func}``, ``{py:class}``, ...) must have resolved to a
  link: Sphinx renders one that did not as bare code, with no warning outside nitpicky mode;
- every entry of the API reference (a function, class or method signature of ``book/api.html``;
  properties and constants are found through their class or module) must have its ``[source]`` link (``sphinx.ext.viewcode``) to a page of the site;
- every listing a chapter shows with ``show_source`` (a code block whose first line is
  ``# tformer/<module>.py``) must come with its link to the highlighted source page,
  ``_modules/tformer/<module>.html#<name>`` (``book/_ext/source_links.py``), and a chapter with a
  "Where is this in the code" section must have at least one: the reader's one hop from the
  chapter to the code. The link's file and anchor are checked like any other.

External links (http, https, mailto, ...) are not fetched: the site must work offline, and
the tests download nothing. Uses the standard library only.
"""
import argparse
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

LINK_ATTRS = {"a": "href", "link": "href", "img": "src", "script": "src", "iframe": "src"}
API_PAGE = "book/api.html"
# a show_source listing's first line, as Pygments highlights it, and the link above it
LISTING = re.compile(r'<span class="c1"># tformer/[A-Za-z0-9_/]+\.py</span>')
SOURCE_LINK = re.compile(r'<a class="tformer-source-link" href="(?:\.\./)*_modules/tformer/'
                         r'[A-Za-z0-9_/]+\.html#[A-Za-z0-9_.]+"')
WHERE = "Where is this in the code"


class Page(HTMLParser):
    """The ids, links, unresolved cross-references and API signatures of one HTML page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids = set()
        self.links = []                 # (line, url)
        self.unresolved = []            # (line, text of the reference)
        self.signatures = []            # [line, id, has a [source] link]
        self._stack = []                # open elements: (tag, classes)
        self._xref = None               # [line, text] of an unresolved reference being read
        self._sig = None                # the signature being read
        self._kind = ""                 # the kind of the API entry being read: function, class, ...

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        for key in ("id", "name"):
            if a.get(key):
                self.ids.add(a[key])
        if tag in LINK_ATTRS and a.get(LINK_ATTRS[tag]):
            self.links.append((self.getpos()[0], a[LINK_ATTRS[tag]]))
        if tag == "code" and "xref" in classes and "py" in classes \
                and not any(t == "a" for t, _ in self._stack):
            self._xref = [self.getpos()[0], ""]
        if tag == "dl" and "py" in classes:
            self._kind = (classes - {"py"}).pop() if len(classes) > 1 else ""
        if tag == "dt" and {"sig", "sig-object", "py"} <= classes and a.get("id") \
                and self._kind not in NO_SOURCE:
            self._sig = [self.getpos()[0], a["id"], False]
            self.signatures.append(self._sig)
        if tag == "span" and "viewcode-link" in classes and self._sig is not None:
            self._sig[2] = True
        if tag not in VOID:
            self._stack.append((tag, classes))

    def handle_endtag(self, tag):
        while self._stack:
            top, _ = self._stack.pop()
            if top == tag:
                break
        if tag == "code" and self._xref is not None:
            self.unresolved.append(tuple(self._xref))
            self._xref = None
        if tag == "dt":
            self._sig = None

    def handle_data(self, data):
        if self._xref is not None:
            self._xref[1] += data


#: API entries that are not code objects (viewcode links functions, classes and methods; a
#: property or a constant is found through the [source] link of its class or module).
NO_SOURCE = {"data", "attribute", "property"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


def parse(path):
    page = Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    page.close()
    return page


def check(site):
    """A list of problems (strings) of the site in the folder ``site``."""
    site = Path(site).resolve()
    # _static holds the theme's Jinja templates (not pages); _sources the pages' sources.
    pages = {p: parse(p) for p in sorted(site.rglob("*.html"))
             if p.relative_to(site).parts[0] not in ("_static", "_sources")}
    problems = []
    for path, page in pages.items():
        name = path.relative_to(site)
        for line, url in page.links:
            parts = urlsplit(url)
            if parts.scheme or url.startswith("//"):
                continue                                        # external: not fetched
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.is_relative_to(site) or not target.exists():
                problems.append(f"{name}:{line}: link to {url!r}: no such file in the site")
                continue
            anchor = unquote(parts.fragment)
            if anchor and target.suffix == ".html":
                ids = pages[target].ids if target in pages else parse(target).ids
                if anchor not in ids:
                    problems.append(f"{name}:{line}: link to {url!r}: no id {anchor!r} in "
                                    f"{target.relative_to(site)}")
        if name.parts[0] == "notebooks":
            html = path.read_text(encoding="utf-8", errors="replace")
            listings, links = len(LISTING.findall(html)), len(SOURCE_LINK.findall(html))
            if listings > links or (WHERE in html and not links):
                problems.append(f"{name}: {listings} show_source listing(s) but {links} link(s) "
                                f"to the highlighted source (_modules/...#name)")
        for line, text in page.unresolved:
            problems.append(f"{name}:{line}: reference {text.strip()!r} resolves to nothing "
                            f"(not in the API reference?)")
    api = site / API_PAGE
    if api in pages:
        sigs = pages[api].signatures
        if not sigs:
            problems.append(f"{API_PAGE}: no API entries found")
        for line, ident, has_source in sigs:
            if not has_source:
                problems.append(f"{API_PAGE}:{line}: API entry {ident!r} has no [source] link")
    else:
        problems.append(f"{API_PAGE}: missing")
    return problems, len(pages), sum(len(p.links) for p in pages.values())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", nargs="?", default="_build/html", help="the built site (default: %(default)s)")
    args = parser.parse_args(argv)
    if not (Path(args.site) / "index.html").exists():
        print(f"check_links: no site at {args.site} (run `make book` first)", file=sys.stderr)
        return 2
    problems, n_pages, n_links = check(args.site)
    for p in problems:
        print(p)
    print(f"check_links: {n_pages} pages, {n_links} internal and external links, "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
