"""Lesson 07: the GEMM in Triton, and the order in which programs visit the tiles of C.

One Triton *program* computes one BLOCK_SIZE_M x BLOCK_SIZE_N tile of C: it walks K in
steps of BLOCK_SIZE_K, loading a tile of A and a tile of B each step and adding their product
(``tl.dot``) into an fp32 accumulator. Triton decides the rest (how threads share the tile,
shared memory, tensor-core instructions, the cp.async pipeline): what lessons 02-06 wrote
by hand.

What the programmer still decides is *which tile each program gets*. Programs are launched
in order of ``tl.program_id(0)``, and about one per multiprocessor runs at a time (132 on an
H200). Row-major order (``GROUP_SIZE_M = 1``) hands consecutive programs the tiles of one row
of C: the wave shares one strip of A but needs every strip of B, and B's strips are evicted
from L2 before the next row comes back to them. Grouped order walks ``GROUP_SIZE_M`` rows of
tiles column by column, so a wave touches a squarer patch of C: fewer distinct strips of A and
B, more hits in L2. :func:`grouped_pid` is the mapping; ``common.grouped_order`` is its
plain Python twin (tested to be a bijection, ragged last group included).

Every shape and stride: strides are kernel arguments and pointers advance by them, so
transposed and sliced operands need no copy; rows of A and columns of B past the edge wrap
around (``% M``, ``% N``: they stay in bounds and their results are never stored), loads are
masked on the K that remains, and the store is masked on M and N. Offsets are 32-bit: the
launcher refuses operands whose largest offset does not fit.

Precision: fp16 and bf16 operands go to the tensor cores (wgmma on Hopper) with an fp32
accumulator, rounded to the input dtype once, after the K loop. fp32 operands would go to
the tensor cores as **TF32** by default (``tl.dot``'s ``input_precision="tf32"``: a 10-bit
mantissa, relative error near 1e-3, 100x the fp32 tolerance, and not what cuBLAS does with
TF32 off). This kernel passes ``input_precision="ieee"`` for fp32: true fp32 FMAs, slower,
but the same arithmetic as the cuBLAS SGEMM it is compared with.

Engines: Triton's interpreter (no GPU) runs the same kernel on CPU tensors with small tiles.
It computes ``tl.dot`` of bf16 operands wrongly (it multiplies the raw 16-bit patterns as
integers), so there the launcher widens bf16 operands to fp32 (exact) and the kernel rounds
the fp32 result to bf16 at the store: the same numbers up to summation order, but the bf16
tensor-core path itself runs only on a GPU. Lessons use fp16 on CPU.
"""
from __future__ import annotations

from collections import namedtuple

import torch
import triton
import triton.language as tl

from .. import engines
from ..common import NOMINAL_SMS, cdiv, dtype_name, grouped_order
from . import Kernel

__all__ = ["matmul_kernel", "grouped_pid", "grouped_order", "program_order", "first_wave",
           "wave_traffic", "TileConfig", "config_for", "check_offsets", "aligned", "operands", "matmul",
           "rowmajor", "asm_job", "asm"]


# ------------------------------------------------------------------ the tile order
@triton.jit
def grouped_pid(pid, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    """Program id -> (pid_m, pid_n): GROUP_SIZE_M rows of tiles, walked column by column."""
    num_pid_in_group = GROUP_SIZE_M * num_pid_n        # programs in one group of rows
    group_id = pid // num_pid_in_group                 # which group this program is in
    first_pid_m = group_id * GROUP_SIZE_M              # its first row of tiles
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_SIZE_M)  # the last is ragged
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)   # down the column...
    pid_n = (pid % num_pid_in_group) // group_size_m                  # ...then the next one
    return pid_m, pid_n


def program_order(num_pid_m, num_pid_n, group_size_m):
    """A (num_pid_m, num_pid_n) int tensor: the program id that computes each tile of C."""
    order = torch.full((num_pid_m, num_pid_n), -1, dtype=torch.int64)
    for pid in range(num_pid_m * num_pid_n):
        order[grouped_order(pid, num_pid_m, num_pid_n, group_size_m)] = pid
    return order


def first_wave(M, N, BM, BN, group_size_m, programs=NOMINAL_SMS):
    """How many distinct row strips of A and column strips of B the first ``programs``
    programs read (one program per multiprocessor: 132 on an H200).

    Each program reads one BM-row strip of A and one BN-column strip of B, a BK-deep tile of
    each per K step. Returns ``(a_strips, b_strips)``: at every K step the wave asks for
    ``2 * programs`` tiles, of which only ``a_strips + b_strips`` are different, so at best
    that many come from DRAM and the rest hit in L2.
    """
    num_pid_m, num_pid_n = cdiv(M, BM), cdiv(N, BN)
    wave = range(min(programs, num_pid_m * num_pid_n))
    tiles = [grouped_order(p, num_pid_m, num_pid_n, group_size_m) for p in wave]
    return len({m for m, _ in tiles}), len({n for _, n in tiles})


def wave_traffic(M, N, BM, BN, group_size_m, programs=NOMINAL_SMS):
    """The fraction of the first wave's tile loads that must come from DRAM, at best.

    Per K step the wave requests ``programs`` A tiles (BM rows each) and as many B tiles
    (BN columns each); the distinct ones are read from DRAM once and every other request
    hits in L2 (if L2 keeps them long enough). Returns distinct / requested, in bytes.
    """
    num_pid = cdiv(M, BM) * cdiv(N, BN)
    a_strips, b_strips = first_wave(M, N, BM, BN, group_size_m, programs)
    return (a_strips * BM + b_strips * BN) / (min(programs, num_pid) * (BM + BN))


# ------------------------------------------------------------------ the kernel
@triton.jit
def matmul_kernel(
        # pointers to the matrices
        a_ptr, b_ptr, c_ptr,
        # dimensions: A is M x K, B is K x N, C is M x N
        M, N, K,
        # strides: how far (in elements) to step to the next row / column of each matrix
        stride_am, stride_ak,
        stride_bk, stride_bn,
        stride_cm, stride_cn,
        # meta-parameters: compile-time constants, one compiled kernel per combination
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,      # 1: row-major tile order; 8: grouped
        INPUT_PRECISION: tl.constexpr,   # "ieee" for fp32 (no TF32); "tf32" (ignored) otherwise
):
    # 1. which tile of C this program computes (see grouped_pid)
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pid_m, pid_n = grouped_pid(pid, num_pid_m, num_pid_n, GROUP_SIZE_M)

    # 2. pointers to the first K-tile of A (BLOCK_SIZE_M x BLOCK_SIZE_K) and of B (BK x BN).
    #    Rows of A and columns of B past the edge wrap around (% M, % N): in bounds, and
    #    their results land outside C, where the store mask drops them.
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)

    # 3. walk K: load, multiply-accumulate in fp32, advance the pointers by BLOCK_SIZE_K
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_left = K - k * BLOCK_SIZE_K                  # the last K-tile may be partial:
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)   # zeros past K
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)   # add nothing
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    # 4. round to the output dtype once, after the loop, and store the part inside C
    c = acc.to(c_ptr.dtype.element_ty)
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    tl.store(c_ptrs, c, mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


# ------------------------------------------------------------------ configurations
# one launch configuration: the tile sizes (meta-parameters) and how Triton compiles them
TileConfig = namedtuple("TileConfig", "BM BN BK num_warps num_stages")


# H200: 128 x 256 tiles of fp16/bf16 (two warpgroups, each a 64 x 256 wgmma), 64-deep K
# tiles, 3 stages of cp.async (3 x 48 KB of shared memory). fp32 with IEEE products runs on
# the FMA units: a smaller tile, 32 deep, keeps the registers and shared memory in budget.
GPU_CONFIG = {torch.float16: TileConfig(128, 256, 64, 8, 3),
              torch.bfloat16: TileConfig(128, 256, 64, 8, 3),
              torch.float32: TileConfig(128, 128, 32, 8, 3)}
# The interpreter: 16 x 16 x 16 tiles, so the suite's small shapes span several tiles,
# several K steps and a ragged last group.
SIM_CONFIG = TileConfig(16, 16, 16, 1, 1)
GROUP_SIZE_M = 8


def config_for(dtype):
    """The tile configuration this engine uses for ``dtype``."""
    return GPU_CONFIG[dtype] if engines.on_gpu() else SIM_CONFIG


def check_offsets(*pairs):
    # the kernel's offsets are int32: (rows - 1) * row stride + (cols - 1) * col stride
    for t in pairs:
        if sum((s - 1) * st for s, st in zip(t.shape, t.stride())) >= 2 ** 31:
            raise ValueError(f"an operand of shape {tuple(t.shape)} with strides "
                             f"{t.stride()} needs offsets beyond 2**31 elements: this "
                             "kernel uses 32-bit offsets; split the product")


def aligned(values, itemsize):
    """``DIV`` for a kernel that takes it: for each size or stride in ``values`` (elements),
    the largest power of two, up to the elements in 16 bytes (8 halves), that divides it.

    Triton proves a value a multiple of 16 or nothing, so a row of 2520 halves (a multiple
    of 8, not of 16) is loaded 2 bytes at a time. Told 8, it loads 16 bytes at a time; told
    2 (a row of 9238 halves), 4 bytes, still wide enough for ``cp.async`` and its pipeline.
    A 1 stays 1: Triton makes a unit stride a constant itself."""
    unit = max(1, 16 // itemsize)
    div = []
    for v in values:
        d = unit if v != 1 else 1
        while d > 1 and v % d:
            d //= 2
        div.append(d)
    return tuple(div)


def operands(a, b):
    """(a, b, input precision) as the kernel gets them on this engine."""
    if a.dtype == torch.bfloat16 and not engines.on_gpu():
        # the interpreter's tl.dot gets bf16 wrong: widen (exactly) to fp32, see the docstring
        return a.float(), b.float(), "ieee"
    return a, b, ("ieee" if a.dtype == torch.float32 else "tf32")


def matmul(a, b, c, *, group_size_m=GROUP_SIZE_M, config=None, kernel=None):
    """C = A @ B with :func:`matmul_kernel` (or ``kernel``, a @triton.jit function with the
    same arguments); one program per BM x BN tile of C.

    Masks in the kernel handle every shape and stride (no padding, no copies; bf16 on the
    interpreter is widened to fp32, see the module's docstring).
    """
    M, K = a.shape
    N = b.shape[1]
    cfg = config or config_for(a.dtype)
    check_offsets(a, b, c)
    a, b, precision = operands(a, b)
    grid = (cdiv(M, cfg.BM) * cdiv(N, cfg.BN),)
    (kernel or matmul_kernel)[grid](
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_SIZE_M=cfg.BM, BLOCK_SIZE_N=cfg.BN, BLOCK_SIZE_K=cfg.BK,
        GROUP_SIZE_M=group_size_m, INPUT_PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return c


def rowmajor(a, b, c):
    """The same kernel with GROUP_SIZE_M = 1: programs walk the tiles of C row by row."""
    return matmul(a, b, c, group_size_m=1)


def asm_job(dtype=torch.float16, *, config=None, group_size_m=GROUP_SIZE_M, cc=(9, 0),
            size=4096, kernel=None):
    """The compilation of the GPU configuration for ``cc`` (default: Hopper, sm_90) as a
    launch on a contiguous ``size``-cubed product would specialise it (for
    :func:`gemm_lessons.triton_asm.compile_kernels`)."""
    cfg = config or GPU_CONFIG[dtype]
    name = dtype_name(dtype)
    args = {"a_ptr": name, "b_ptr": name, "c_ptr": name, "M": size, "N": size, "K": size,
            "stride_am": size, "stride_ak": 1, "stride_bk": size, "stride_bn": 1,
            "stride_cm": size, "stride_cn": 1}
    constants = {"BLOCK_SIZE_M": cfg.BM, "BLOCK_SIZE_N": cfg.BN, "BLOCK_SIZE_K": cfg.BK,
                 "GROUP_SIZE_M": group_size_m,
                 "INPUT_PRECISION": "ieee" if dtype == torch.float32 else "tf32"}
    return dict(fn=kernel or matmul_kernel, args=args, constants=constants,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages, cc=cc)


def asm(dtype=torch.float16, **kw):
    """What the GPU configuration compiles to (see :func:`asm_job`), with no GPU needed:
    ``{'ttgir', 'ptx', 'sass', 'shared', 'num_warps'}``."""
    from .. import triton_asm
    return triton_asm.compile_kernels([asm_job(dtype, **kw)])[0]


DTYPES = (torch.float16, torch.bfloat16, torch.float32)

KERNELS = [
    Kernel("k07_triton_swizzle", 7, "triton", DTYPES,
           "Triton, grouped tile order (GROUP_SIZE_M=8): more L2 hits per wave",
           launch=matmul, source=matmul_kernel, min_cc=(8, 0),
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
    Kernel("k07_triton_rowmajor", 7, "triton", DTYPES,
           "Triton, row-major tile order (GROUP_SIZE_M=1): the baseline of lesson 07",
           launch=rowmajor, source=matmul_kernel, min_cc=(8, 0), in_ladder=False,
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
]
