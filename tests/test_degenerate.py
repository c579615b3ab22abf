"""Every registered kernel on the smallest products, in every layout: M, N and K of 1 at
once, a product smaller than any tile, and strided operands. A kernel computes them or its
launcher hands them to one that does; never a driver error.

On a GPU every kernel runs every case (the driver refuses TMA maps the simulator's
emulation takes). On the CPU the Triton kernels run every case in the interpreter; the numba
kernels, one simulated Python thread per CUDA thread, are left to the shape suite, which
has M, N and K of 1."""
import pytest
import torch

import gemm_lessons as gl
from gemm_lessons.harness import Case

ON_GPU = gl.backend() == "cuda"
CASES = [
    Case("1x1x1", 1, 1, 1),
    Case("tiny, strided", 2, 3, 5, "transposed", "sliced"),
    Case("one row, B transposed", 1, 7, 9, "row", "transposed"),
    Case("one column, A sliced", 3, 1, 2, "sliced", "row"),
    Case("one tile", 16, 16, 16),
]


def _kernels():
    for k in gl.kernels():
        if ON_GPU or k.language == "triton":
            yield k.name


@pytest.mark.parametrize("kernel", list(_kernels()))
def test_the_smallest_products(kernel):
    if not gl.runs_here(kernel):
        pytest.skip(f"{kernel} does not run on this engine")
    entry = next(k for k in gl.kernels() if k.name == kernel)
    cases = CASES
    dtypes = entry.dtypes if ON_GPU else (
        (torch.float16,) if torch.float16 in entry.dtypes else entry.dtypes[:1])
    report = gl.check(kernel, cases=cases, dtypes=dtypes, raise_on_fail=False)
    assert report.ok, str(report)
