"""README's generated regions (tools/update_readme.py): Colab links and the runs-where table
come from tools/colab.py's REPO_URL and from the registry."""
import json
import sys
from dataclasses import replace
from pathlib import Path

import gemm_lessons as gl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import colab  # noqa: E402
import update_readme  # noqa: E402


def _region(text, start, end):
    return text.split(start, 1)[1].split(end, 1)[0]


def test_every_lesson_row_opens_its_notebook_in_colab():
    rows = [l for l in update_readme.table().splitlines()[2:] if l.startswith("| ")]
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert len(rows) == len(notebooks)
    for row, nb in zip(rows, notebooks):
        assert f"[open in Colab]({colab.colab_url(f'notebooks/{nb.name}')})" in row, row


def test_runs_where_cells_follow_the_registry():
    k = next(k for k in gl.kernels() if k.name == "k06_wgmma")
    assert (k.min_cc, k.cc_below) == ((9, 0), (10, 0))
    other = replace(k, name="k_other", min_cc=(7, 0), cc_below=None)
    assert update_readme._where([k, other], None) == "simulator"
    assert update_readme._where([k, other], (7, 5)) == "GPU; simulator: `k06_wgmma`"
    assert update_readme._where([k, other], (9, 0)) == "GPU"
    assert update_readme._where([k, other], (10, 0)) == "GPU; simulator: `k06_wgmma`"
    assert update_readme._where([k], (8, 0)) == "simulator"
    assert update_readme._where([], (7, 5)) == "yes"


def test_runs_where_table_has_a_row_per_lesson_and_sits_after_the_lessons():
    text = update_readme.render((ROOT / "README.md").read_text())
    lessons_end = text.index(update_readme.END)
    where = text.index(update_readme.WHERE_START)
    assert lessons_end < where and text[lessons_end:where].strip() == update_readme.END
    body = _region(text, update_readme.WHERE_START, update_readme.WHERE_END)
    rows = [l for l in body.splitlines() if l.startswith("| 0") or l.startswith("| 1")]
    assert [r.split("|")[1].strip() for r in rows] == \
        [p.name[:2] for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    by_notebook = update_readme.kernels_by_notebook(gl.kernels(), notebooks)
    for r, nb in zip(rows, notebooks):
        cells = [c.strip() for c in r.strip("|").split("|")]
        ks = by_notebook[nb]
        for (_, cc, _), cell in zip(update_readme.MACHINES, cells[1:]):
            assert cell == update_readme._where(ks, cc)
            if ks and cc == (9, 0):
                assert cell == "GPU", "every lesson runs on an H100/H200"


def test_render_adds_the_runs_where_region_once():
    text = (ROOT / "README.md").read_text()
    stripped = text.replace(
        text[text.index(update_readme.WHERE_START):
             text.index(update_readme.WHERE_END) + len(update_readme.WHERE_END)], "")
    once = update_readme.render(stripped)
    assert once.count(update_readme.WHERE_START) == 1
    assert update_readme.render(once) == once


def test_a_lesson_in_two_notebooks_lists_each_kernel_where_it_is_checked(tmp_path):
    def notebook(name, code):
        path = tmp_path / name
        path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": code}]}))
        return path
    first = notebook("09_a.ipynb", 'print(gl.check("k_one"))')
    second = notebook("09_b.ipynb", "print(gl.check_anywhere('k_two'))\nk_one")
    other = notebook("10_c.ipynb", "")
    k = next(iter(gl.kernels()))
    one, two, three = (replace(k, name=n, lesson=9) for n in ("k_one", "k_two", "k_three"))
    got = update_readme.kernels_by_notebook([one, two, three], [first, second, other])
    assert got == {first: [one, three], second: [two], other: []}
