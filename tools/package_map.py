"""The package map of README.md, rendered from ``tests/import_layers.py`` (the folders' order) and
each folder's ``__init__.py`` (what it holds): prints it, or with ``--write`` rewrites the block
between README's two ``package map`` markers. ``tests/house/test_imports.py`` fails when they differ."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import import_layers  # noqa: E402

BEGIN, END = "<!-- package map: begin -->", "<!-- package map: end -->"


def readme_block(text):
    """The text between the markers of README's package map (without the fence lines)."""
    inner = text.split(BEGIN, 1)[1].split(END, 1)[0]
    return inner.strip().removeprefix("```").removesuffix("```").strip("\n")


def main():
    rendered = import_layers.package_map(os.path.join(ROOT, "tformer"))
    if "--write" not in sys.argv[1:]:
        print(rendered)
        return
    path = os.path.join(ROOT, "README.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{BEGIN}\n```\n{rendered}\n```\n{END}{tail}")


if __name__ == "__main__":
    main()
