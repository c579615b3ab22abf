"""Lesson 01: one thread per output element, and why the thread-to-element mapping matters.

Both kernels compute ``C[row, col] = sum_k A[row, k] * B[k, col]`` with one thread per
element of C and the same arithmetic. They differ only in which thread gets which element:

* ``naive_kernel``: ``threadIdx.x`` walks down a *column* of C. The 32 lanes of a warp
  read ``A[row..row+31, k]`` and write ``C[row..row+31, col]``: 32 addresses a whole row
  apart, 32 separate 32-byte sectors per warp request (uncoalesced).
* ``coalesced_kernel``: ``threadIdx.x`` walks along a *row* of C. The lanes read
  ``B[k, col..col+31]`` and write ``C[row, col..col+31]``: 128 contiguous bytes, 4 sectors
  (coalesced); ``A[row, k]`` is one address for the whole warp (a broadcast).

Any shape: the grid is rounded up and threads outside C return. Any strides: numba arrays
index through their strides, so transposed and sliced operands need no copy.
"""
from numba import cuda, float32

from .. import engines as backend
from ..common import cdiv
from . import FP32, Kernel

BLOCK = (32, 8)  # 32 threads along threadIdx.x (one warp), 8 along threadIdx.y


@cuda.jit
def naive_kernel(A, B, C):
    # uncoalesced: consecutive threadIdx.x -> consecutive *rows*
    row = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    col = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if row < C.shape[0] and col < C.shape[1]:
        acc = float32(0.0)
        for k in range(A.shape[1]):
            acc += A[row, k] * B[k, col]
        C[row, col] = acc


@cuda.jit
def coalesced_kernel(A, B, C):
    # coalesced: consecutive threadIdx.x -> consecutive *columns*
    col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if row < C.shape[0] and col < C.shape[1]:
        acc = float32(0.0)
        for k in range(A.shape[1]):
            acc += A[row, k] * B[k, col]
        C[row, col] = acc



def naive(a, b, c):
    """C = A @ B, one thread per element, threads mapped down columns (uncoalesced)."""
    M, N = c.shape
    grid = (cdiv(M, BLOCK[0]), cdiv(N, BLOCK[1]))
    A, B, C = backend.as_numba(a), backend.as_numba(b), backend.as_numba(c)
    naive_kernel[grid, BLOCK, backend.numba_stream()](A, B, C)


def coalesced(a, b, c):
    """C = A @ B, one thread per element, threads mapped along rows (coalesced)."""
    M, N = c.shape
    grid = (cdiv(N, BLOCK[0]), cdiv(M, BLOCK[1]))
    A, B, C = backend.as_numba(a), backend.as_numba(b), backend.as_numba(c)
    coalesced_kernel[grid, BLOCK, backend.numba_stream()](A, B, C)


_SIG = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"

KERNELS = [
    Kernel("k01_naive", 1, "numba", FP32,
           "one thread per element of C, lanes walk down a column: uncoalesced",
           launch=naive, source=naive_kernel,
           ptx=lambda cc: (naive_kernel.py_func, _SIG)),
    Kernel("k01_coalesced", 1, "numba", FP32,
           "one thread per element of C, lanes walk along a row: coalesced",
           launch=coalesced, source=coalesced_kernel,
           ptx=lambda cc: (coalesced_kernel.py_func, _SIG)),
]
