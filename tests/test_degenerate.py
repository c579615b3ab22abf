"""Every registered kernel on the smallest products, in every layout: M, N and K of 1 at
once, a product smaller than any tile, and strided operands. A kernel computes them or its
launcher hands them to one that does; never a driver error.

On a GPU every kernel runs every case. On the simulator (each CUDA thread a Python thread)
the Triton kernels run every case, and the numba kernels whose launchers choose between TMA
and pointer paths one case each; the shape suite covers M, N and K of 1 for all of them."""
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
TMA_CHOOSERS = {"k06_producer_consumer", "k06_persistent", "k06_wide_stores"}


def _kernels():
    for k in gl.kernels():
        if ON_GPU or k.language == "triton" or k.name in TMA_CHOOSERS:
            yield k.name


@pytest.mark.parametrize("kernel", list(_kernels()))
def test_the_smallest_products(kernel):
    if not gl.runs_here(kernel):
        pytest.skip(f"{kernel} does not run on this engine")
    entry = next(k for k in gl.kernels() if k.name == kernel)
    cases = CASES if ON_GPU or entry.language == "triton" else CASES[1:2]
    dtypes = entry.dtypes if ON_GPU else (
        (torch.float16,) if torch.float16 in entry.dtypes else entry.dtypes[:1])
    report = gl.check(kernel, cases=cases, dtypes=dtypes, raise_on_fail=False)
    assert report.ok, str(report)
