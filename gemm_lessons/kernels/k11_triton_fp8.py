"""Lesson 11: the FP8 GEMM with scales, in Triton.

An FP8 operand is a tensor of 8-bit values ``q`` and the scales ``s`` that bring them back
to the real numbers: ``A ~ qa * sa`` and ``B ~ qb * sb`` (see :mod:`gemm_lessons.fp8`). The
tensor cores multiply the FP8 values; the scales are applied around that product:

1. ``tensorwise_kernel`` (**k11_fp8_tensorwise**): one scale per operand. ``C = (qa @ qb) *
   sa * sb``: the K loop is lesson 07's, on FP8 tiles; the epilogue multiplies the fp32
   accumulator by one number.
2. ``rowwise_kernel`` (**k11_fp8_rowwise**): one scale per row of A (``sa``: (M, 1)) and per
   column of B (``sb``: (1, N)). Row m of A and column n of B meet only in C[m, n], so the
   scales still factor out of the sum over K: the epilogue multiplies each row of the tile
   by its ``sa`` and each column by its ``sb``.
3. ``blockwise_kernel`` (**k11_fp8_blockwise**): one scale per 1 x 128 block of A (a row,
   128 K-values wide: ``sa`` is (M, ceil(K / 128))) and per 128 x 128 block of B (``sb``:
   (ceil(K / 128), ceil(N / 128))), DeepSeek-V3's training recipe. The scales now change
   along K, so they no longer factor out of the sum: each K-step's product is computed on its
   own (``tl.dot`` from zero, in the tensor core's accumulator), multiplied by the scales of
   its K block, and added into the fp32 accumulator on the CUDA cores. That addition is also
   the *promotion*: the tensor core's accumulator never holds more than one K-step. A tile's
   columns lie in one 128-wide block of B (``BLOCK_SIZE_N`` divides 128), so a K-step's
   scales are one factor per row, ``sa * sb``, and the promotion one multiply-add per element.
   ``blockwise_two_step_kernel`` (not registered: what the compilers make of it is the
   lesson's point) computes the same sum two K-steps per iteration and promotes step k
   after issuing step k + 1's dot, so that the CUDA cores' multiply-adds could run while the
   tensor core works. Triton then leaves the second dot running (no wait after it), but
   ptxas finds the multiply-adds reading a ``wgmma``'s accumulator registers while another
   ``wgmma`` is in flight and serializes every ``wgmma`` of the loop (its message C7514).
   Triton keeps a dot in flight only when its result goes straight into the next dot's
   accumulator; within one program of ``tl`` code the promotion therefore waits for the
   tensor core (``wgmma.wait_group 0``), and overlap has to come from other programs (or
   warpgroups) on the same multiprocessor.
4. ``rowwise_promoted_kernel`` (**k11_fp8_rowwise_promoted**): step 2 with
   ``tl.dot(..., max_num_imprecise_acc=BLOCK_SIZE_K)``, which asks Triton to do the same
   promotion for a kernel whose scales need none.
5. ``rowwise_tma_kernel`` (**k11_fp8_rowwise_tma**): step 2 on lesson 08's fast path (TMA
   descriptors, a persistent grid). An FP8 ``wgmma`` reads both operands K-major (the PTX
   ISA transposes tiles for fp16/bf16 only), so B comes in through a descriptor of its
   transpose, the (N, K) weight of ``nn.Linear`` (``torch._scaled_mm``'s layout), and
   ``tl.dot`` takes ``bt.T``, a view. Operands a descriptor cannot address in place are
   copied into padded buffers first (``k08_triton_tma.tma_view``). Needs sm_90.
6. ``blockwise_tma_kernel`` (**k11_fp8_blockwise_tma**): step 3's promotion on step 5's fast
   path. Since one program waits for its tensor core before promoting, the launcher puts as
   many programs on a multiprocessor as fit (:func:`resident_programs`: two of 64 x 128 on 4
   warps), so that one program's multiply-adds can run while another's ``wgmma`` does.
   Needs sm_90.

Precision. On Hopper (sm_90), an FP8 ``wgmma`` adds its products into an accumulator that
keeps about 14 significant bits, not fp32's 24 (measured by DeepSeek-V3 and SageAttention2;
see :mod:`gemm_lessons.fp8`). ``tl.dot(a, b, acc)`` passes ``acc`` to the instruction, so
the whole K loop accumulates at that precision (Triton's default for FP8 on sm_90:
``max_num_imprecise_acc`` = 2**30, "never promote"). With ``max_num_imprecise_acc=N`` (N <=
the dot's K), Triton's compiler gives the instruction a zeroed accumulator and adds it into
``acc`` with fp32 additions after every N products (its lowering test: a 128-deep dot with
N = 32 is four wgmma, each followed by fp32 adds). Steps 1 and 2 accumulate like cuBLAS's
"fast accumulation"; steps 3 and 4 promote every K-step, as ``torch._scaled_mm`` does by
default.

Every shape and stride: as lesson 07 (rows and columns past the edge wrap around, loads are
masked on K, the store on M and N; scale loads follow the wrapped rows and columns, so they
stay in bounds). Offsets are 32-bit. The four pointer kernels share lesson 07's steps as
``@triton.jit`` helpers that Triton inlines: ``tile_pointers`` (the tile, the wrapped rows
and columns, the first K-step's pointers), ``load_tiles`` (a K-step's masked loads) and
``store_tile`` (the masked store). Operands: ``torch.float8_e4m3fn`` or
``torch.float8_e5m2``, the same for A and B; scales float32 with any strides; C in bf16, fp16
or fp32 (or FP8, for the registry's plain ``a @ b``, see below). Needs compute capability
8.9 (FP8 tensor cores: Ada, Hopper) on a GPU.

Engines. Triton's interpreter runs these kernels on CPU tensors: it computes an FP8
``tl.dot`` exactly (numpy products of the FP8 values, fp32 sums), so on the CPU the
accumulator's reduced precision does not exist and ``max_num_imprecise_acc`` has no effect:
:func:`gemm_lessons.fp8.emulated_dot` models it instead. The interpreter's conversion of fp32
to FP8 is wrong for values beyond the format's range (it does not saturate), so there an FP8
C is rounded by torch after the kernel.

The registry's contract (``gl.matmul(a, b)``, ``gl.check``): ``c = a @ b`` with every scale
1 and C in the operands' FP8 dtype, as ``torch._scaled_mm`` does without ``out_dtype``.
The scaled product: ``gl.scaled_matmul(a, b, scale_a, scale_b, kernel=...)``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import engines
from ..common import cdiv, dtype_name
from ..fp8 import SCALE_BLOCK
from . import Kernel
from .k07_triton_swizzle import TileConfig, check_offsets, grouped_pid
from .k08_triton_tma import persistent_programs, tma_view

__all__ = ["tensorwise_kernel", "rowwise_kernel", "blockwise_kernel", "rowwise_promoted_kernel",
           "rowwise_tma_kernel", "blockwise_tma_kernel", "blockwise_two_step_kernel",
           "TWO_STEP_CONFIG", "tile_pointers", "load_tiles", "store_tile",
           "FP8", "OUT_DTYPES", "SCALE_BLOCK", "GPU_CONFIG", "PROMOTED_CONFIG", "BLOCK_TMA_CONFIG",
           "SIM_CONFIG",
           "GROUP_SIZE_M", "gpu_config", "config_for", "resident_programs", "scale_shapes",
           "unit_scales", "scaled", "plain", "asm_job"]

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32) + FP8


# ------------------------------------------------------------ the pointer kernels' shared steps
@triton.jit
def tile_pointers(a_ptr, b_ptr, M, N, stride_am, stride_ak, stride_bk, stride_bn,
                  BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                  BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr):
    """Lesson 07's prologue: this program's tile of C (grouped order), its rows of A and
    columns of B (past the edge they wrap around), the pointers of its first K-step's tiles."""
    pid = tl.program_id(axis=0)
    pid_m, pid_n = grouped_pid(pid, tl.cdiv(M, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N),
                               GROUP_SIZE_M)
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    return pid_m, pid_n, offs_am, offs_bn, a_ptrs, b_ptrs


@triton.jit
def load_tiles(a_ptrs, b_ptrs, k, K, BLOCK_SIZE_K: tl.constexpr):
    """K-step ``k``'s FP8 tiles of A and B, zeros past K."""
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    k_left = K - k * BLOCK_SIZE_K
    a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
    b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
    return a, b


@triton.jit
def store_tile(c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn,
               BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """The tile of C, in C's dtype, masked at the edges."""
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


# ------------------------------------------------------------------ 1. one scale per tensor
@triton.jit
def tensorwise_kernel(
        # pointers: the FP8 operands, C, and the two scales (one float32 each)
        a_ptr, b_ptr, c_ptr, scale_a_ptr, scale_b_ptr,
        M, N, K,
        stride_am, stride_ak,
        stride_bk, stride_bn,
        stride_cm, stride_cn,
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,
):
    pid_m, pid_n, offs_am, offs_bn, a_ptrs, b_ptrs = tile_pointers(
        a_ptr, b_ptr, M, N, stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M)

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        a, b = load_tiles(a_ptrs, b_ptrs, k, K, BLOCK_SIZE_K)      # FP8 tiles
        acc = tl.dot(a, b, acc)            # FP8 x FP8 on the tensor cores, fp32 out
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    # the epilogue: the scales factor out of the sum over K, one multiply per element
    acc = acc * (tl.load(scale_a_ptr) * tl.load(scale_b_ptr))
    store_tile(c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_SIZE_M, BLOCK_SIZE_N)


# ------------------------------------------------------------------ 2. per row of A, per column of B
@triton.jit
def rowwise_kernel(
        # pointers: the FP8 operands, C, and the scales: M of A's rows, N of B's columns
        a_ptr, b_ptr, c_ptr, scale_a_ptr, scale_b_ptr,
        M, N, K,
        stride_am, stride_ak,
        stride_bk, stride_bn,
        stride_cm, stride_cn,
        stride_sam, stride_sbn,
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,
):
    pid_m, pid_n, offs_am, offs_bn, a_ptrs, b_ptrs = tile_pointers(
        a_ptr, b_ptr, M, N, stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M)

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        a, b = load_tiles(a_ptrs, b_ptrs, k, K, BLOCK_SIZE_K)      # FP8 tiles
        acc = tl.dot(a, b, acc)            # FP8 x FP8 on the tensor cores, fp32 out
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    # the epilogue: row m's scale and column n's scale multiply C[m, n]
    scale_a = tl.load(scale_a_ptr + offs_am * stride_sam)      # (BLOCK_SIZE_M,)
    scale_b = tl.load(scale_b_ptr + offs_bn * stride_sbn)      # (BLOCK_SIZE_N,)
    acc = acc * scale_a[:, None] * scale_b[None, :]
    store_tile(c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_SIZE_M, BLOCK_SIZE_N)


# ------------------------------------------------------------------ 3. block scales in the K loop
@triton.jit
def blockwise_kernel(
        # pointers: the FP8 operands, C, and the scales of A's 1 x 128 and B's 128 x 128 blocks
        a_ptr, b_ptr, c_ptr, scale_a_ptr, scale_b_ptr,
        M, N, K,
        stride_am, stride_ak,
        stride_bk, stride_bn,
        stride_cm, stride_cn,
        stride_sam, stride_sak,            # scale_a: (M, ceil(K / 128))
        stride_sbk, stride_sbn,            # scale_b: (ceil(K / 128), ceil(N / 128))
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,
        SCALE_BLOCK: tl.constexpr,         # 128; BLOCK_SIZE_K and BLOCK_SIZE_N divide it
):
    pid_m, pid_n, offs_am, offs_bn, a_ptrs, b_ptrs = tile_pointers(
        a_ptr, b_ptr, M, N, stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M)
    # each row's scales along K; the tile's columns lie in one 128-wide block of B's scales
    sa_ptrs = scale_a_ptr + offs_am * stride_sam                            # (BLOCK_SIZE_M,)
    sb_ptr = scale_b_ptr + (pid_n * BLOCK_SIZE_N // SCALE_BLOCK) * stride_sbn   # one scale

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        kb = (k * BLOCK_SIZE_K) // SCALE_BLOCK                  # the K block of this step
        # its scales, loaded before the tensor core starts; sa * sb: one factor per row
        scale = tl.load(sa_ptrs + kb * stride_sak) * tl.load(sb_ptr + kb * stride_sbk)
        a, b = load_tiles(a_ptrs, b_ptrs, k, K, BLOCK_SIZE_K)      # FP8 tiles
        partial = tl.dot(a, b)             # this K-step alone, in the tensor core's accumulator
        # promotion: one fp32 multiply-add per element, on the CUDA cores
        acc += partial * scale[:, None]
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    store_tile(c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_SIZE_M, BLOCK_SIZE_N)


# ------------------------------------------------------------------ 3b. the promotion one step late
@triton.jit
def blockwise_two_step_kernel(
        # the arguments of blockwise_kernel
        a_ptr, b_ptr, c_ptr, scale_a_ptr, scale_b_ptr,
        M, N, K,
        stride_am, stride_ak,
        stride_bk, stride_bn,
        stride_cm, stride_cn,
        stride_sam, stride_sak,
        stride_sbk, stride_sbn,
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,
        SCALE_BLOCK: tl.constexpr,
):
    pid_m, pid_n, offs_am, offs_bn, a_ptrs, b_ptrs = tile_pointers(
        a_ptr, b_ptr, M, N, stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M)
    sa_ptrs = scale_a_ptr + offs_am * stride_sam
    sb_ptr = scale_b_ptr + (pid_n * BLOCK_SIZE_N // SCALE_BLOCK) * stride_sbn
    k_steps = tl.cdiv(K, BLOCK_SIZE_K)

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    second = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)   # no step before 0
    second_scale = tl.zeros((BLOCK_SIZE_M,), dtype=tl.float32)
    for k in range(0, k_steps, 2):                      # two K-steps per iteration
        kb = (k * BLOCK_SIZE_K) // SCALE_BLOCK
        scale = tl.load(sa_ptrs + kb * stride_sak) * tl.load(sb_ptr + kb * stride_sbk)
        a, b = load_tiles(a_ptrs, b_ptrs, k, K, BLOCK_SIZE_K)
        first = tl.dot(a, b)                            # step k
        acc += second * second_scale[:, None]           # step k - 1, promoted
        # an odd count of K-steps: the last step k + 1 loads zeros, times the last scales
        kb = tl.minimum(((k + 1) * BLOCK_SIZE_K) // SCALE_BLOCK, (K - 1) // SCALE_BLOCK)
        second_scale = tl.load(sa_ptrs + kb * stride_sak) * tl.load(sb_ptr + kb * stride_sbk)
        a, b = load_tiles(a_ptrs + BLOCK_SIZE_K * stride_ak, b_ptrs + BLOCK_SIZE_K * stride_bk,
                          k + 1, K, BLOCK_SIZE_K)
        second = tl.dot(a, b)                           # step k + 1, left running ...
        acc += first * scale[:, None]                   # ... while step k is promoted
        a_ptrs += 2 * BLOCK_SIZE_K * stride_ak
        b_ptrs += 2 * BLOCK_SIZE_K * stride_bk
    acc += second * second_scale[:, None]

    store_tile(c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_SIZE_M, BLOCK_SIZE_N)


# ------------------------------------------------------------------ 4. per row, promoted by Triton
@triton.jit
def rowwise_promoted_kernel(
        # pointers: the FP8 operands, C, and the scales: M of A's rows, N of B's columns
        a_ptr, b_ptr, c_ptr, scale_a_ptr, scale_b_ptr,
        M, N, K,
        stride_am, stride_ak,
        stride_bk, stride_bn,
        stride_cm, stride_cn,
        stride_sam, stride_sbn,
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,
):
    pid_m, pid_n, offs_am, offs_bn, a_ptrs, b_ptrs = tile_pointers(
        a_ptr, b_ptr, M, N, stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M)

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        a, b = load_tiles(a_ptrs, b_ptrs, k, K, BLOCK_SIZE_K)      # FP8 tiles
        # at most BLOCK_SIZE_K products in the tensor core's accumulator, then an fp32 add
        acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_SIZE_K)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    # the epilogue: row m's scale and column n's scale multiply C[m, n]
    scale_a = tl.load(scale_a_ptr + offs_am * stride_sam)      # (BLOCK_SIZE_M,)
    scale_b = tl.load(scale_b_ptr + offs_bn * stride_sbn)      # (BLOCK_SIZE_N,)
    acc = acc * scale_a[:, None] * scale_b[None, :]
    store_tile(c_ptr, acc, pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_SIZE_M, BLOCK_SIZE_N)


# ------------------------------------------------------------------ 5. per row, lesson 08's fast path
@triton.jit
def rowwise_tma_kernel(
        # TMA descriptors of A (M x K), of B's transpose (N x K: W of nn.Linear) and of C
        a_desc, bt_desc, c_desc, scale_a_ptr, scale_b_ptr,
        M, N, K,
        stride_sam, stride_sbn,
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,
        NUM_SMS: tl.constexpr,             # the loop's step; the grid is min(NUM_SMS, tiles)
):
    start_pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    # persistent: this program takes tiles start_pid, start_pid + NUM_SMS, ... in grouped order
    for tile_id in tl.range(start_pid, num_pid_m * num_pid_n, NUM_SMS, flatten=True):
        pid_m, pid_n = grouped_pid(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for ki in range(k_tiles):
            # one bulk copy per tile; outside the operand the copy engine fills zeros
            a = a_desc.load([pid_m * BLOCK_SIZE_M, ki * BLOCK_SIZE_K])
            bt = bt_desc.load([pid_n * BLOCK_SIZE_N, ki * BLOCK_SIZE_K])   # K-major, as wgmma wants FP8
            acc = tl.dot(a, bt.T, acc)
        # the epilogue: row m's scale and column n's scale multiply C[m, n]
        offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
        offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
        scale_a = tl.load(scale_a_ptr + offs_am * stride_sam)      # (BLOCK_SIZE_M,)
        scale_b = tl.load(scale_b_ptr + offs_bn * stride_sbn)      # (BLOCK_SIZE_N,)
        acc = acc * scale_a[:, None] * scale_b[None, :]
        c_desc.store([pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N], acc.to(c_desc.dtype))


# ------------------------------------------------------------------ 6. block scales, on the fast path
@triton.jit
def blockwise_tma_kernel(
        # TMA descriptors of A (M x K), of B's transpose (N x K: W of nn.Linear) and of C
        a_desc, bt_desc, c_desc, scale_a_ptr, scale_b_ptr,
        M, N, K,
        stride_sam, stride_sak,            # scale_a: (M, ceil(K / 128))
        stride_sbk, stride_sbn,            # scale_b: (ceil(K / 128), ceil(N / 128))
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,
        NUM_SMS: tl.constexpr,             # the loop's step; the grid is min(NUM_SMS, tiles)
        SCALE_BLOCK: tl.constexpr,         # 128; BLOCK_SIZE_K and BLOCK_SIZE_N divide it
):
    start_pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    # persistent: this program takes tiles start_pid, start_pid + NUM_SMS, ... in grouped order
    for tile_id in tl.range(start_pid, num_pid_m * num_pid_n, NUM_SMS, flatten=True):
        pid_m, pid_n = grouped_pid(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
        offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
        sa_ptrs = scale_a_ptr + offs_am * stride_sam                        # (BLOCK_SIZE_M,)
        sb_ptr = scale_b_ptr + (pid_n * BLOCK_SIZE_N // SCALE_BLOCK) * stride_sbn
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for ki in range(k_tiles):
            kb = (ki * BLOCK_SIZE_K) // SCALE_BLOCK
            scale = tl.load(sa_ptrs + kb * stride_sak) * tl.load(sb_ptr + kb * stride_sbk)
            # one bulk copy per tile; outside the operand the copy engine fills zeros
            a = a_desc.load([pid_m * BLOCK_SIZE_M, ki * BLOCK_SIZE_K])
            bt = bt_desc.load([pid_n * BLOCK_SIZE_N, ki * BLOCK_SIZE_K])   # K-major, as wgmma wants FP8
            # the block kernel's promotion: the K-step alone, then one multiply-add an element
            acc += tl.dot(a, bt.T) * scale[:, None]
        c_desc.store([pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N], acc.to(c_desc.dtype))


# ------------------------------------------------------------------ configurations
# H200, scales in the epilogue: 128 x 256 tiles 128 deep (four 32-deep FP8 wgmma per
# K-step), 3 stages of (16 + 32) KB. tools/sweep_fp8.py --configs times the alternatives.
GPU_CONFIG = TileConfig(128, 256, 128, 8, 3)
# H200, promotion in the K loop: a thread holds two fp32 tiles, the running sum and the
# K-step's partial sum. 128 x 256 over 256 threads is 2 x 128 registers a thread, past the
# 255 a thread may have: the compiled kernel spills to local memory inside the K loop.
# 128 x 128 over 256 threads is 2 x 64 (ptxas: 182 registers, no spills), one K-step per
# 128-wide scale block, and a tile's columns share one scale of B; 4 stages of (16 + 16) KB.
PROMOTED_CONFIG = TileConfig(128, 128, 128, 8, 4)
# blockwise_tma_kernel: 64 x 128 tiles on one warpgroup, 3 stages of (8 + 16) KB and the
# output tile staged for its TMA store: two programs a multiprocessor (resident_programs)
BLOCK_TMA_CONFIG = TileConfig(64, 128, 128, 4, 3)
# blockwise_two_step_kernel: two K-steps' tiles per stage, 2 x (16 + 16) KB; 2 stages
TWO_STEP_CONFIG = TileConfig(128, 128, 128, 8, 2)
# the interpreter: 16 x 16 tiles 32 deep (FP8 dots need K >= 32 on a GPU, kept here), so a
# 128-wide scale block spans four K-steps and the suite's shapes span several tiles
SIM_CONFIG = TileConfig(16, 16, 32, 1, 1)
GROUP_SIZE_M = 8
PROMOTING = (blockwise_kernel, rowwise_promoted_kernel, blockwise_two_step_kernel,
             blockwise_tma_kernel)


def gpu_config(kernel):
    """The GPU configuration of ``kernel``: PROMOTED_CONFIG for the kernels that promote in
    the K loop (TWO_STEP_CONFIG for the two-step one, BLOCK_TMA_CONFIG for the TMA one),
    GPU_CONFIG for the others."""
    if kernel is blockwise_two_step_kernel:
        return TWO_STEP_CONFIG
    if kernel is blockwise_tma_kernel:
        return BLOCK_TMA_CONFIG
    return PROMOTED_CONFIG if kernel in PROMOTING else GPU_CONFIG


def config_for(kernel=blockwise_kernel):
    """The tile configuration of ``kernel`` on this engine."""
    return gpu_config(kernel) if engines.on_gpu() else SIM_CONFIG


def scale_shapes(granularity, M, N, K):
    """The shapes of (scale_a, scale_b) a kernel of this granularity takes: "tensor" ((), ()),
    "row" ((M, 1), (1, N)), "block" ((M, ceil(K / 128)), (ceil(K / 128), ceil(N / 128)))."""
    if granularity == "tensor":
        return (), ()
    if granularity == "row":
        return (M, 1), (1, N)
    if granularity == "block":
        kb = cdiv(K, SCALE_BLOCK)
        return (M, kb), (kb, cdiv(N, SCALE_BLOCK))
    raise ValueError(f"unknown scale granularity {granularity!r}")


def unit_scales(granularity, M, N, K, device):
    """Scales of 1 in the shapes of :func:`scale_shapes`: the registry's plain ``a @ b``."""
    sa, sb = scale_shapes(granularity, M, N, K)
    return (torch.ones(sa, dtype=torch.float32, device=device),
            torch.ones(sb, dtype=torch.float32, device=device))


def _check_block_tile(granularity, cfg):
    """Block scales: a K-step lies in one 128-deep scale block, a tile's columns in one
    128-wide block of B."""
    if granularity == "block" and SCALE_BLOCK % cfg.BK:
        raise ValueError(f"BK={cfg.BK} must divide the scale block ({SCALE_BLOCK}): a K-step "
                         "may not straddle two scale blocks")
    if granularity == "block" and SCALE_BLOCK % cfg.BN:
        raise ValueError(f"BN={cfg.BN} must divide the scale block ({SCALE_BLOCK}): a tile's "
                         "columns share one block scale of B")


def _scale_args(granularity, sa, sb):
    """The scales' strides a kernel of this granularity takes, and its extra constants."""
    if granularity == "tensor":
        return (), {}
    if granularity == "row":
        return (sa.stride(0), sb.stride(1)), {}
    return (sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1)), {"SCALE_BLOCK": SCALE_BLOCK}


def _launch(kernel, granularity, a, b, sa, sb, c, config):
    M, K = a.shape
    N = b.shape[1]
    cfg = config or config_for(kernel)
    _check_block_tile(granularity, cfg)
    check_offsets(a, b, c)
    scale_strides, extra = _scale_args(granularity, sa, sb)
    grid = (cdiv(M, cfg.BM) * cdiv(N, cfg.BN),)
    kernel[grid](a, b, c, sa, sb, M, N, K,
                 a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                 *scale_strides,
                 BLOCK_SIZE_M=cfg.BM, BLOCK_SIZE_N=cfg.BN, BLOCK_SIZE_K=cfg.BK,
                 GROUP_SIZE_M=GROUP_SIZE_M, num_warps=cfg.num_warps,
                 num_stages=cfg.num_stages, **extra)


def resident_programs(cfg, in_bytes=1, out_bytes=2):
    """How many programs of ``cfg`` fit on one multiprocessor at once, by shared memory (228 KB
    a multiprocessor: the operand stages and the output tile staged for its TMA store) and by
    registers (65,536 a multiprocessor; a thread may take 255). Two programs of 64 x 128 on 4
    warps fit, so that one promotes while the other's wgmma runs; 128 x 128 on 8 warps, one."""
    smem = (cfg.num_stages * (cfg.BM + cfg.BN) * cfg.BK * in_bytes + cfg.BM * cfg.BN * out_bytes
            + 1024)                                # barriers and alignment
    by_smem = 228 * 1024 // smem
    by_regs = 65536 // (255 * 32 * cfg.num_warps)
    return max(1, min(by_smem, by_regs))


def _launch_tma(kernel, granularity, a, b, sa, sb, c, config, sms=None):
    """The persistent TMA kernel: descriptors of A, of B's transpose and of C. An operand
    a descriptor cannot address in place (lesson 08's rule: unit last stride, rows 16 bytes
    apart) is copied into a padded buffer first: A row-major, B column-major (``W.t()``)
    and K a multiple of 16 are used in place."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    M, K = a.shape
    N = b.shape[1]
    cfg = config or config_for(kernel)
    if config is None:
        # the output tile is staged in shared memory for its TMA store: an fp32 one (128 x 256
        # x 4 bytes = 128 KB) and three stages of operands (3 x 48 KB) pass the 227 KB there,
        # so fewer stages
        staged = cfg.BM * cfg.BN * c.element_size()
        stage = (cfg.BM + cfg.BN) * cfg.BK * a.element_size()
        fits = max(1, (227 * 1024 - staged) // stage)
        cfg = cfg._replace(num_stages=min(cfg.num_stages, fits))
    _check_block_tile(granularity, cfg)
    scale_strides, extra = _scale_args(granularity, sa, sb)
    if sms is None:
        sms = persistent_programs(c.device) * resident_programs(cfg, a.element_size(),
                                                                c.element_size())
    a, bt = tma_view(a), tma_view(b.t())
    out = tma_view(c, copy=False)
    descs = (TensorDescriptor.from_tensor(a, [cfg.BM, cfg.BK]),
             TensorDescriptor.from_tensor(bt, [cfg.BN, cfg.BK]),
             TensorDescriptor.from_tensor(out, [cfg.BM, cfg.BN]))
    tiles = cdiv(M, cfg.BM) * cdiv(N, cfg.BN)
    kernel[(min(sms, tiles),)](*descs, sa, sb, M, N, K, *scale_strides,
                               BLOCK_SIZE_M=cfg.BM, BLOCK_SIZE_N=cfg.BN, BLOCK_SIZE_K=cfg.BK,
                               GROUP_SIZE_M=GROUP_SIZE_M, NUM_SMS=sms,
                               num_warps=cfg.num_warps, num_stages=cfg.num_stages, **extra)
    if out is not c:
        c.copy_(out)


def scaled(kernel, granularity, how=_launch):
    """The launcher of ``kernel``: ``launch(a, b, scale_a, scale_b, out, config=None)``
    writes ``(a * scale_a) @ (b * scale_b)`` into ``out`` (arguments validated by
    ``gl.scaled_matmul``)."""
    def launch(a, b, scale_a, scale_b, out, config=None):
        if out.dtype in FP8 and not engines.on_gpu():
            # the interpreter's fp32 -> FP8 conversion does not saturate: round in torch
            wide = torch.empty(out.shape, dtype=torch.float32, device=out.device)
            how(kernel, granularity, a, b, scale_a, scale_b, wide, config)
            top = torch.finfo(out.dtype).max
            out.copy_(wide.clamp(-top, top))
            return out
        how(kernel, granularity, a, b, scale_a, scale_b, out, config)
        return out
    launch.__name__ = f"launch_{granularity}"
    return launch


def plain(launch, granularity):
    """The registry's ``launch(a, b, c)``: ``c = a @ b`` with every scale 1."""
    def matmul(a, b, c):
        sa, sb = unit_scales(granularity, a.shape[0], b.shape[1], a.shape[1], a.device)
        return launch(a, b, sa, sb, c)
    return matmul


def asm_job(kernel, granularity, dtype=torch.float8_e4m3fn, *, config=None, cc=(9, 0),
            size=4096, out_dtype=torch.bfloat16):
    """The compilation of the GPU configuration for ``cc`` as a launch on contiguous
    ``size``-cubed operands (A row-major, B column-major: ``W.t()``) would specialise it (for
    :func:`gemm_lessons.triton_asm.compile_kernels`)."""
    cfg = config or gpu_config(kernel)
    name = dtype_name(dtype)
    args = {"a_ptr": name, "b_ptr": name, "c_ptr": dtype_name(out_dtype),
            "scale_a_ptr": "float32", "scale_b_ptr": "float32", "M": size, "N": size,
            "K": size, "stride_am": size, "stride_ak": 1, "stride_bk": 1, "stride_bn": size,
            "stride_cm": size, "stride_cn": 1}
    if granularity == "row":
        args.update(stride_sam=1, stride_sbn=1)
    if granularity == "block":
        kb = cdiv(size, SCALE_BLOCK)
        args.update(stride_sam=kb, stride_sak=1, stride_sbk=cdiv(size, SCALE_BLOCK),
                    stride_sbn=1)
    constants = {"BLOCK_SIZE_M": cfg.BM, "BLOCK_SIZE_N": cfg.BN, "BLOCK_SIZE_K": cfg.BK,
                 "GROUP_SIZE_M": GROUP_SIZE_M}
    if granularity == "block":
        constants["SCALE_BLOCK"] = SCALE_BLOCK
    if kernel in (rowwise_tma_kernel, blockwise_tma_kernel):
        # descriptors of A, of B's transpose and of C in place of their pointers and strides;
        # the grid of an H100's 132 multiprocessors
        for gone in ("a_ptr", "b_ptr", "c_ptr", "stride_am", "stride_ak", "stride_bk",
                     "stride_bn", "stride_cm", "stride_cn"):
            del args[gone]
        args.update(a_desc={"desc": name, "block": [cfg.BM, cfg.BK]},
                    bt_desc={"desc": name, "block": [cfg.BN, cfg.BK]},
                    c_desc={"desc": dtype_name(out_dtype), "block": [cfg.BM, cfg.BN]})
        constants["NUM_SMS"] = 132
    return dict(fn=kernel, args=args, constants=constants, num_warps=cfg.num_warps,
                num_stages=cfg.num_stages, cc=cc)


_STEPS = [
    ("k11_fp8_tensorwise", tensorwise_kernel, "tensor", _launch, (8, 9),
     "FP8 (e4m3/e5m2) GEMM, one scale per operand applied in the epilogue"),
    ("k11_fp8_rowwise", rowwise_kernel, "row", _launch, (8, 9),
     "FP8 GEMM, a scale per row of A and per column of B, in the epilogue"),
    ("k11_fp8_blockwise", blockwise_kernel, "block", _launch, (8, 9),
     "FP8 GEMM, 1x128 (A) and 128x128 (B) block scales applied in the K loop, promoted to fp32"),
    ("k11_fp8_rowwise_promoted", rowwise_promoted_kernel, "row", _launch, (8, 9),
     "k11_fp8_rowwise with max_num_imprecise_acc=BLOCK_SIZE_K: fp32 promotion every K-step"),
    ("k11_fp8_rowwise_tma", rowwise_tma_kernel, "row", _launch_tma, (9, 0),
     "k11_fp8_rowwise on lesson 08's fast path: TMA descriptors, a persistent grid"),
    ("k11_fp8_blockwise_tma", blockwise_tma_kernel, "block", _launch_tma, (9, 0),
     "k11_fp8_blockwise on lesson 08's fast path: TMA descriptors, a persistent grid"),
]

KERNELS = [
    Kernel(name, 11, "triton", FP8, summary, launch=plain(scaled(fn, gran, how), gran),
           source=fn, min_cc=cc, in_ladder=False, step=i + 1,
           configs={"gpu": gpu_config(fn), "simulator": SIM_CONFIG},
           scaled=scaled(fn, gran, how), scales=gran)
    for i, (name, fn, gran, how, cc, summary) in enumerate(_STEPS)
]
