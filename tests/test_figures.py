"""Every measured figure quoted in prose agrees with the recorded CSV."""
from pathlib import Path

import pytest

from conftest import load_module
from gemm_lessons.results import FigureError, figure

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    return load_module("render_figures", ROOT / "tools" / "render_figures.py")


def test_quoted_figures_match_the_csv():
    diffs = _tool().render(check=True)
    assert not diffs, "\n".join(diffs) + "\n(run: python tools/render_figures.py)"


def test_figure_reads_the_csv():
    r = figure("k04_register_tiling 4096 ratio")
    assert r.count(".") == 1 and len(r.split(".")[1]) == 2
    assert float(figure("k04_register_tiling float32 4096 ms")) > 0


@pytest.mark.parametrize("key", ["k04_register_tiling 4096", "no_such_kernel 4096 ratio",
                                 "k04_register_tiling 4096 speed"])
def test_bad_keys_are_named(key):
    with pytest.raises(FigureError, match="figure key"):
        figure(key)


def test_a_wrong_quote_is_reported(tmp_path):
    tool = _tool()
    diffs = []
    out = tool._render_text('<span data-fig="k04_register_tiling 4096 ratio">9.99</span>x',
                            "x.md", diffs)
    assert diffs and "9.99" in diffs[0]
    assert "9.99" not in out
