"""``kernel="auto"``: which of the course's kernels a call runs when the user does not say.

No kernel suits every product, and timing every kernel at call time would cost more than
most products. The choice is a rule, read off the operands alone, in the order a GPU
engineer would ask:

1. **Where does it run?** Off a GPU (numba's simulator, Triton's interpreter) the Triton
   kernels run far faster than simulated CUDA threads: lesson 08's split-K kernel for a
   plain product, lesson 09's fused kernel for a product with an epilogue. Below Hopper
   (no TMA, no wgmma) the same two.
2. **Can TMA address the operands?** On Hopper (compute capability 9.x), fp16 and bf16:
   a TMA descriptor needs rows whose length in bytes is a multiple of 16 (a multiple of 8
   halves) and 16-byte-aligned bases. Where a row is not (K or N not a multiple of 8),
   pointer loads of A or B cannot be 16 bytes wide and the kernels that use them run at
   about half of cuBLAS; ``k08_triton_tma`` stages such an operand through a padded,
   aligned copy (one extra pass over it, small beside the product) and keeps its wide
   copies.
3. **How many tiles?** With few rows (M below 2048 for a plain product), a 128 x 256 tile
   grid leaves most of the 132 multiprocessors idle: split-K (lesson 08) cuts K into
   slices so that there are enough programs. With many rows, the persistent TMA kernel.
4. **An epilogue?** ``gl.gemm`` with bias and activation: lesson 09's TMA split-K kernel,
   whose epilogue runs after the last slice; batched products the batched TMA kernel.
   fp32 products run lesson 08's split-K kernel with its fp32 (IEEE) configurations.

:func:`kernel_for` returns the name; ``gl.matmul(a, b, kernel="auto")`` and
``gl.gemm(..., kernel="auto")`` run it. The figures behind each threshold are in the results
CSV (``h200_front_door.csv``), timed as a user calls the kernels.
"""
from __future__ import annotations

import torch

from . import engines

__all__ = ["AUTO", "kernel_for", "tma_addressable", "MANY_ROWS"]

AUTO = "auto"
MANY_ROWS = 2048          # from here on a plain product has tiles enough for every SM


def tma_addressable(t):
    """Whether a TMA descriptor can read the 2-D tensor ``t`` in place: unit last stride,
    rows a multiple of 16 bytes apart, a 16-byte-aligned base."""
    size = t.element_size()
    return (t.stride(-1) == 1 and (t.stride(-2) * size) % 16 == 0 and t.data_ptr() % 16 == 0
            and t.stride(-2) >= t.shape[-1])


def kernel_for(a, b, *, fused=False, batched=False):
    """The registered kernel ``kernel="auto"`` runs for ``a @ b`` (``fused``: a ``gl.gemm``
    call with an epilogue; ``batched``: a 3-D operand or C)."""
    eng = engines.engine()
    half = a.dtype in (torch.float16, torch.bfloat16)
    hopper = eng.kind == "cuda" and tuple(eng.capability)[0] == 9
    if fused:
        if batched:
            return "k09_fused_tma" if hopper and half else "k09_fused_epilogue"
        if hopper and half:
            return "k09_fused_tma_splitk"
        return "k09_fused_splitk" if eng.kind == "cuda" else "k09_fused_epilogue"
    if not (hopper and half):
        return "k08_triton_splitk"
    M = a.shape[-2]
    aligned = tma_addressable(a) and tma_addressable(b) and (b.shape[-1] * a.element_size()) % 16 == 0
    if not aligned or M >= MANY_ROWS:
        return "k08_triton_tma"
    return "k08_triton_splitk"
