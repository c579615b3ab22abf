"""Lesson 06 reads its long kernels a part at a time (labs.k06.show_part, show_diff_part):
the parts, put together, are the whole source and the whole diff."""
import contextlib
import io
import re

import pytest

import gemm_lessons as gl
from gemm_lessons.labs import k06 as lab


def printed(fn, *args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args)
    return out.getvalue().splitlines()


def changed(lines):
    return [l for l in lines if l[:1] in "+-" and not l.startswith(("+++", "---"))]


MARKS = {"k06_double_buffer": ["@cuda.jit", "def issue", "# -- prologue"],
         "k06_producer_consumer": ["if wg == 0", "else:", "# -- epilogue"]}


@pytest.mark.parametrize("name", sorted(MARKS))
def test_parts_make_the_whole_source(name):
    marks = [None] + MARKS[name] + [None]
    parts = [l for a, b in zip(marks, marks[1:]) for l in printed(lab.show_part, name, a, b)]
    assert parts == printed(gl.show_source, name)


def test_diff_parts_make_the_whole_diff():
    old, new = "k06_producer_consumer", "k06_persistent"
    marks = [None] + MARKS[old] + [None]
    parts = [printed(lab.show_diff_part, old, new, a, b) for a, b in zip(marks, marks[1:])]
    whole = printed(gl.show_diff, old, new)
    assert [l for p in parts for l in changed(p)] == changed(whole)
    # each hunk's line numbers are the whole sources', so its first context line is there
    src_old = printed(gl.show_source, old)
    for p in parts:
        for n, line in enumerate(p):
            m = re.match(r"@@ -(\d+)", line)
            if m and p[n + 1][:1] in " -":
                assert src_old[int(m[1]) - 1] == p[n + 1][1:]


def test_a_missing_marker_is_named():
    with pytest.raises(ValueError, match="no such line"):
        lab.show_part("k06_wgmma", "no such line")
    with pytest.raises(ValueError, match="nowhere"):
        lab.show_part("k06_wgmma", "# -- epilogue", "nowhere")
