"""Sphinx configuration of the rendered course (``python tools/build_site.py``).

The site is built from the notebooks' stored outputs: nothing is executed, and nothing is
fetched at build time or by the pages: the theme (furo) ships its files, and MathJax is
served from the copy the ``jupyter-server-mathjax`` package ships (see ``_copy_mathjax``).
tools/build_site.py lays the sources out (this folder, README.md, notebooks/, exercises/,
gemm_lessons/results/) in a staging folder and runs Sphinx on it.
"""
from pathlib import Path

project = "gemm-lessons"
author = "the gemm-lessons authors"
copyright = "the gemm-lessons authors"

extensions = ["myst_nb"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["README.md", "_ladder_table.md", "_build", "**/.ipynb_checkpoints"]

# Stored outputs only: the course is run by nbval in CI, the site shows what it stored.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
# Lessons skip heading levels in places; and links to files outside the site (kernel
# sources, tools) stay plain text.
suppress_warnings = ["myst.header", "myst.xref_missing", "misc.highlighting_failure"]

html_theme = "furo"
html_title = "gemm-lessons"
html_static_path = ["_static"]
html_favicon = "_static/favicon.svg"          # else browsers ask the server for /favicon.ico
html_show_sourcelink = False
html_copy_source = False

# MathJax 2 from the local copy: no CDN.
mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
mathjax2_config = {
    "tex2jax": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]],
                "processEscapes": True, "processClass": "math|output_area",
                "ignoreClass": "document"},
    # the package ships the STIX-Web fonts only
    "HTML-CSS": {"availableFonts": ["STIX-Web"], "preferredFont": "STIX-Web",
                 "webFont": "STIX-Web", "imageFont": None,
                 # MathJax's blank font points at about:blank, which a browser refuses
                 # (a console error on every page with math): a local() source instead
                 "styles": {"@font-face": {"font-family": "MathJax_Blank",
                                           "src": "local('MathJax_Blank')"}}},
    "menuSettings": {"zoom": "None"},
    "showMathMenu": False,
}


def _copy_mathjax(app, exception):
    """Put MathJax (from the jupyter-server-mathjax package) under _static/mathjax."""
    if exception is not None or app.builder.format != "html":
        return
    import shutil
    import jupyter_server_mathjax
    src = Path(jupyter_server_mathjax.__file__).parent / "static"
    dst = Path(app.outdir) / "_static" / "mathjax"
    def other_languages(folder, names):
        return [n for n in names if Path(folder).name == "localization" and n != "en"]

    if not (dst / "MathJax.js").exists():
        shutil.copytree(src, dst, dirs_exist_ok=True, ignore=other_languages)


def setup(app):
    app.connect("build-finished", _copy_mathjax)
