"""``kernel="auto"``: which of the course's kernels a call runs when the user does not say.

No kernel suits every product, and timing every kernel at call time would cost more than
most products. The choice is a rule, read off the operands alone, in the order a GPU
engineer would ask:

1. **Where does it run?** Off a GPU (numba's simulator, Triton's interpreter) the Triton
   kernels run far faster than simulated CUDA threads: lesson 08's split-K kernel for a
   plain product, lesson 09's fused kernel for a product with an epilogue. Below Hopper
   (no TMA, no wgmma), and for fp32, lesson 08's split-K kernel and lesson 09's split-K
   fused kernel.
2. **Is the product small?** Below 2**27 multiply-adds (M x N x K) the call's host time
   matters more than the kernel's: split-K with pointer loads, which reads the operands
   where they are (no copy) and replays as one launch.
3. **Can the loads be 16 bytes wide?** A row whose length in bytes is not a multiple of 16
   (K or N not a multiple of 8 halves) forces narrow pointer loads, at about half of
   cuBLAS. Where both M and N are 256 or more, ``k08_triton_tma`` stages such an operand
   through a padded, aligned copy (one pass over it, small beside the product) and keeps
   its wide TMA copies; on thinner products the copy costs more than it saves.
4. **How many tiles, and how evenly do they fill the GPU?** A grid of 128 x 256 tiles
   runs in waves of one tile per multiprocessor (132 on an H200): 144 tiles take two waves,
   the second with 12 tiles and 120 multiprocessors idle. The unsplit TMA kernels are chosen
   from 2048 rows on where their tiles fill their waves at least three-quarters full on
   average; where 128 x 256 tiles do not but 128 x 128 tiles do, the kernel takes those
   (at 6128 x 568: 48 x 3 = 144 tiles fill 2 waves 55 % full, 48 x 5 = 240 fill them 91 %;
   :func:`~gemm_lessons.common.wave_tile`). Elsewhere (at 2048 x 1024 there are only
   16 x 4 = 64 tiles of 128 x 256, 16 x 8 = 128 of 128 x 128) split-K (lesson 08) cuts K
   into slices so that there are programs enough.
5. **Is B the transposed weight?** ``W.t()`` of an ``nn.Linear`` weight has contiguous
   columns: lesson 08's TMA kernel would copy it, while lesson 09's TMA kernel builds its
   descriptor on ``W`` itself and transposes each tile in shared memory (free for wgmma).
   With no epilogue asked for, that kernel computes a plain product.
6. **An epilogue?** ``gl.gemm`` with bias and activation: where split-K would be chosen,
   lesson 09's split-K fused kernel (pointer loads: its call costs the least host time,
   and its slices fill the GPU), else the TMA fused kernel; batched products the batched
   TMA kernel.

7. **FP8 with scales?** ``gl.scaled_matmul(..., kernel="auto")`` reads the granularity off
   the scales' shapes (one number each: per tensor; (M, 1) and (1, N): per row and column;
   one per 1 x 128 block of A and 128 x 128 block of B: per block) and runs lesson 11's
   kernel for it; per row, on Hopper, the kernel on lesson 08's fast path, which ran at
   1.02x and 1.11x ``torch._scaled_mm`` at 4096 and 8192 on the H200 where the pointer
   kernel ran at 0.85x and 0.98x (``h200_fp8.csv``). :func:`scaled_kernel_for`.

:func:`kernel_for` returns the name; ``gl.matmul(a, b, kernel="auto")`` and
``gl.gemm(..., kernel="auto")`` run it (``gl.auto_kernel`` says which). The measurements
behind each threshold are in ``gemm_lessons/results/h200_front_door.csv``, timed as a user
calls the kernels (``tools/front_door.py``).
"""
from __future__ import annotations

import torch

from . import engines
from .common import FULL_WAVES, cdiv, sm_count, wave_fill, wave_tile

__all__ = ["AUTO", "kernel_for", "scaled_kernel_for", "scale_granularity", "tma_addressable",
           "wide_loads", "wave_fill", "MANY_ROWS", "SMALL"]

AUTO = "auto"
MANY_ROWS = 2048          # rows from which the unsplit TMA kernels may fill the GPU ...
TILES = ((128, 256), (128, 128))  # ... with their tiles (largest first), one per SM a wave
SMALL = 2 ** 27           # multiply-adds below which the host's time per call dominates
WIDE_COPY = 256           # M and N from which staging a misaligned operand pays


def tma_addressable(t):
    """Whether a TMA descriptor can read the 2-D tensor ``t`` in place: unit last stride,
    rows a multiple of 16 bytes apart, a 16-byte-aligned base."""
    size = t.element_size()
    return (t.stride(-1) == 1 and (t.stride(-2) * size) % 16 == 0 and t.data_ptr() % 16 == 0
            and t.stride(-2) >= t.shape[-1])


def wide_loads(t):
    """Whether pointer loads of ``t`` can be 16 bytes wide: one unit stride, the other a
    multiple of 16 bytes, a 16-byte-aligned base (a row-major tensor or a transposed one,
    such as ``W.t()`` of an ``nn.Linear`` weight)."""
    size = t.element_size()
    lead = [s for s in t.stride()[-2:] if s != 1]
    return (1 in t.stride()[-2:] and all((s * size) % 16 == 0 for s in lead)
            and t.data_ptr() % 16 == 0)


def kernel_for(a, b, *, fused=False, batched=False):
    """The registered kernel ``kernel="auto"`` runs for ``a @ b`` (``fused``: a ``gl.gemm``
    call with an epilogue; ``batched``: a 3-D operand or C)."""
    eng = engines.engine()
    half = a.dtype in (torch.float16, torch.bfloat16)
    hopper = eng.kind == "cuda" and tuple(eng.capability)[0] == 9
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    sms = sm_count()
    bm, bn = wave_tile(M, N, TILES, sms)     # the tile the TMA kernels would take
    tiles = cdiv(M, bm) * cdiv(N, bn)
    full = M >= MANY_ROWS and tiles >= sms and wave_fill(tiles, sms) >= FULL_WAVES
    if fused:
        if batched:
            return "k09_fused_tma" if hopper and half else "k09_fused_epilogue"
        if eng.kind != "cuda":
            return "k09_fused_epilogue"
        return "k09_fused_tma" if hopper and half and full else "k09_fused_splitk"
    if not (hopper and half) or M * N * K <= SMALL:
        return "k08_triton_splitk"
    if not (wide_loads(a) and wide_loads(b)):
        return "k08_triton_tma" if min(M, N) >= WIDE_COPY else "k08_triton_splitk"
    if full and tma_addressable(a) and tma_addressable(b):
        return "k08_triton_tma"
    if full and tma_addressable(a) and tma_addressable(b.t()):
        return "k09_fused_tma"            # B = W.t(): a descriptor on W, no copy
    return "k08_triton_splitk"


def scale_granularity(a, b, scale_a, scale_b):
    """"tensor", "row" or "block": the granularity of FP8 scales, read off their shapes (see
    ``gl.scaled_matmul``), or None where they match none. Where two readings coincide (a K
    and an N of at most 128 make the block scales of B one number) they mean the same
    product, and the coarser is taken."""
    from .fp8 import SCALE_BLOCK
    M, K = a.shape
    N = b.shape[1]
    sa, sb = tuple(scale_a.shape), tuple(scale_b.shape)
    if scale_a.numel() == 1 and scale_b.numel() == 1 and len(sa) <= 1 and len(sb) <= 1:
        return "tensor"
    if sa == (M, 1) and sb == (1, N):
        return "row"
    kb, nb = cdiv(K, SCALE_BLOCK), cdiv(N, SCALE_BLOCK)
    if sa == (M, kb) and sb == (kb, nb):
        return "block"
    return None


def scaled_kernel_for(a, b, scale_a, scale_b):
    """The FP8 kernel ``gl.scaled_matmul(..., kernel="auto")`` runs (rule 7 above), or None
    where the scales' shapes match no granularity."""
    gran = scale_granularity(a, b, scale_a, scale_b)
    if gran is None:
        return None
    hopper = engines.on_gpu() and engines.engine().capability[0] == 9
    return {"tensor": "k11_fp8_tensorwise",
            "row": "k11_fp8_rowwise_tma" if hopper else "k11_fp8_rowwise",
            "block": "k11_fp8_blockwise"}[gran]
