"""Sphinx extension: a chapter's link to a function in its .py file leads to its highlighted page.

``tformer.core.source.show_source`` puts a link above each listing it shows,
``<a class="tformer-source-link" href="../tformer/kernels/softmax.py#softmax_forward">``: relative
to ``notebooks/``, so that in JupyterLab it opens the file itself. In the built book there is no
``tformer/`` folder; the same link must lead to the module's page of ``sphinx.ext.viewcode``,
``_modules/tformer/kernels/softmax.html#softmax_forward``. This extension

1. while reading a page, finds such links in its raw HTML and registers each object with viewcode,
   as an API entry would be, so that the module's page is written and carries an anchor (a
   ``viewcode-block``) for it, also for a helper the API reference leaves out (``_softmax_inplace``);
   the page's ``[docs]`` link back leads to the chapter that shows it; a link to an object that is
   not in its file fails the build (a warning, and ``-W``);
2. while writing a page, rewrites the links' targets to the highlighted pages, and gives the first
   link to each object the id that the ``[docs]`` link back points at.

``tools/check_links.py`` then checks that every such link leads to a file and an anchor that exist.
"""
import re

from docutils import nodes
from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging

logger = logging.getLogger(__name__)

#: ``href="../tformer/kernels/softmax.py#softmax_forward"``: the prefix, the module path, the name.
LINK = re.compile(r'href="((?:\.\./)*)(tformer/[A-Za-z0-9_/]+)\.py#([A-Za-z_][A-Za-z0-9_.]*)"')


def register(app, doctree):
    """Register every object a page links to with viewcode (``env._viewcode_modules``)."""
    env = app.builder.env
    modules = env.__dict__.setdefault("_viewcode_modules", {})
    for node in doctree.findall(nodes.raw):
        if "html" not in node.get("format", "").split():
            continue
        for _, path, name in LINK.findall(node.astext()):
            modname = path.replace("/", ".")
            entry = modules.get(modname)
            if not entry:
                try:
                    analyzer = ModuleAnalyzer.for_module(modname)
                    analyzer.find_tags()
                except Exception as e:                          # noqa: BLE001 (any import problem)
                    logger.warning(f"source link to {path}.py#{name}: cannot read {modname}: {e}",
                                   location=node)
                    continue
                entry = modules[modname] = (analyzer.code, analyzer.tags, {}, modname)
            _, tags, used, _ = entry
            if name not in tags:
                logger.warning(f"source link to {path}.py#{name}: {modname} has no {name!r}",
                               location=node)
                continue
            used.setdefault(name, env.docname)


def rewrite(app, pagename, templatename, context, doctree):
    """Point the links of one page at the highlighted module pages."""
    body = context.get("body")
    if not body or "tformer/" not in body:
        return
    seen = set()
    modules = getattr(app.builder.env, "_viewcode_modules", {})

    def to_module_page(match):
        prefix, path, name = match.groups()
        modname = path.replace("/", ".")
        entry = modules.get(modname)
        # viewcode's [docs] link points at "<refname>.<name>", refname being the module under
        # which the first page documented it (tformer.nn.functional for a re-exported kernel)
        target = f"{entry[3] if entry else modname}.{name}"
        ident = "" if target in seen else f' id="{target}"'
        seen.add(target)
        return f'href="{prefix}_modules/{path}.html#{name}"{ident}'

    context["body"] = LINK.sub(to_module_page, body)


def setup(app):
    app.setup_extension("sphinx.ext.viewcode")
    app.connect("doctree-read", register, priority=600)           # after viewcode's own entries
    app.connect("html-page-context", rewrite)
    return {"version": "1", "parallel_read_safe": False, "parallel_write_safe": True}
