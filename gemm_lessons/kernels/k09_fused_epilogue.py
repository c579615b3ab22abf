"""Lesson 09: the reason to own a GEMM: BLAS semantics, a fused epilogue, batches and split-K.

``out = activation(alpha * A @ B + beta * C + bias)`` in one Triton kernel. The K loop is
the tiled, grouped-order GEMM of lessons 07-08; everything after it happens while the tile
is still in registers (the *epilogue*), so the product never makes a round trip through
global memory between the GEMM and the element-wise work (the epilogue itself, and the
second pass of split-K, are in :mod:`k09_epilogue`).

BLAS semantics are decided on the host and baked in as compile-time flags (``HAS_C``), so
``beta == 0`` never loads C (NaN in C cannot leak) and ``alpha == 0`` never launches the
K loop at all (NaN in A or B cannot leak): only the epilogue kernel runs.

Batches: the grid's second axis is the batch index; each operand carries a batch stride,
and a broadcast operand has batch stride 0 (the same matrix for every batch, no copy).
Strides: every operand is addressed through its own strides (transposed and sliced views
work as they are, with no hidden ``.contiguous()``). Shapes: rows/columns past M/N are
clamped to a valid index on load and masked on store; K is masked unless it divides into
BLOCK_SIZE_K (``EVEN_K``).

Split-K (``k09_split_k``, and automatically through :func:`split_k_rule`): when the output
has too few tiles to fill the GPU but K is long (M = N = 256, K = 65536 gives 4 tiles for
132 SMs), the K loop is cut into S slices that run on different SMs. Each slice writes its
fp32 partial sum to a workspace (S, batch, M, N); a second kernel adds the S partials in a
fixed order (deterministic, unlike atomics) and only then applies the epilogue: alpha is
linear and could be applied per slice, but beta * C and the bias must be added once, and
the activation is non-linear (gelu(x) + gelu(y) is not gelu(x + y)).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..common import NOMINAL_SMS, cdiv, simulated, sm_count
from ..engines import on_gpu
from . import Kernel
from .k07_triton_swizzle import grouped_pid
from .k09_epilogue import (ACTIVATION_CODES, LEAKY_SLOPE, apply_activation, epilogue,
                           splitk_epilogue_kernel)

__all__ = ["fused_gemm_kernel", "splitk_epilogue_kernel", "epilogue", "Config",
           "default_config", "split_k_rule", "blas_reads", "fused_gemm", "gemm_auto",
           "gemm_split", "ACTIVATION_CODES", "LEAKY_SLOPE", "apply_activation"]

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_K_ITERS_PER_SPLIT = 8               # a K slice keeps at least 8 BLOCK_SIZE_K steps
MAX_SPLIT_K = 64
MAX_GRID_YZ = 65535                     # CUDA's limit on grid axes 1 and 2


# ----------------------------------------------------------------------------- kernels
@triton.jit
def fused_gemm_kernel(
        # pointers
        a_ptr, b_ptr, c_ptr, bias_ptr, out_ptr,
        # dimensions
        M, N, K,
        # strides: (batch, row, column); a batch stride of 0 broadcasts that operand
        stride_ab, stride_am, stride_ak,
        stride_bb, stride_bk, stride_bn,
        stride_cb, stride_cm, stride_cn,
        stride_bias,
        stride_ob, stride_om, stride_on,
        # split-K: slice p covers K[p * K_PER_SPLIT : (p + 1) * K_PER_SPLIT]; partial sums
        # go to out_ptr + p * stride_os (an fp32 workspace) instead of through the epilogue
        K_PER_SPLIT, stride_os,
        # BLAS scalars
        alpha, beta,
        # meta-parameters
        HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
        IS_SPLIT: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr,
        UPCAST: tl.constexpr,
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr):
    """One (BLOCK_SIZE_M, BLOCK_SIZE_N) tile of batch ``program_id(1)``, K slice
    ``program_id(2)``: the K loop, then the fused epilogue (or an fp32 partial for split-K)."""
    # -- which tile: grouped order (lesson 07), so GROUP_SIZE_M rows of tiles share B's columns
    pid = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pid_m, pid_n = grouped_pid(pid, num_pid_m, num_pid_n, GROUP_SIZE_M)

    # -- which part of K: all of it, or this program's slice
    if IS_SPLIT:
        k_start = tl.program_id(2) * K_PER_SPLIT
        k_len = min(K - k_start, K_PER_SPLIT)
    else:
        k_start = 0
        k_len = K

    # -- the K loop. Rows and columns past M and N read row/column 0 instead (always in
    # bounds; their results are never stored), so the loads need no M/N masks.
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_am = tl.max_contiguous(tl.multiple_of(tl.where(offs_m < M, offs_m, 0), BLOCK_SIZE_M),
                                BLOCK_SIZE_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(tl.where(offs_n < N, offs_n, 0), BLOCK_SIZE_N),
                                BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = (a_ptr + pid_b * stride_ab + offs_am[:, None].to(tl.int64) * stride_am
              + (k_start + offs_k)[None, :].to(tl.int64) * stride_ak)       # (BM, BK)
    b_ptrs = (b_ptr + pid_b * stride_bb + (k_start + offs_k)[:, None].to(tl.int64) * stride_bk
              + offs_bn[None, :].to(tl.int64) * stride_bn)                  # (BK, BN)
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(k_len, BLOCK_SIZE_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:   # the last step reads past K: those elements must be 0
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_len - k * BLOCK_SIZE_K, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_len - k * BLOCK_SIZE_K, other=0.0)
        if UPCAST:  # only in Triton's CPU interpreter, which has no bf16 matmul
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if IEEE:    # fp32 inputs: true fp32 products (the default would round them to TF32)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:       # fp16 / bf16 on tensor cores, fp32 accumulation
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    if IS_SPLIT:
        # a partial sum: bias and activation must wait for the other slices (see the
        # module docstring), so store fp32 as it is; splitk_epilogue_kernel finishes it
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        ws_ptrs = (out_ptr + tl.program_id(2).to(tl.int64) * stride_os + pid_b * stride_ob
                   + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :] * stride_on)
        tl.store(ws_ptrs, acc, mask=mask)
    else:
        epilogue(acc, offs_m, offs_n, pid_b, M, N,
                 c_ptr, stride_cb, stride_cm, stride_cn, bias_ptr, stride_bias,
                 out_ptr, stride_ob, stride_om, stride_on, alpha, beta,
                 HAS_C, HAS_BIAS, ACTIVATION)


# ------------------------------------------------------------------------ configuration
@dataclass(frozen=True)
class Config:
    """Tile sizes and launch parameters of one compiled variant."""
    BLOCK_SIZE_M: int
    BLOCK_SIZE_N: int
    BLOCK_SIZE_K: int
    GROUP_SIZE_M: int = 8
    num_warps: int = 4
    num_stages: int = 3
    maxnreg: int | None = None          # a register cap per thread (ptxas), if any

    def __str__(self):
        return (f"{self.BLOCK_SIZE_M}x{self.BLOCK_SIZE_N}x{self.BLOCK_SIZE_K} "
                f"g{self.GROUP_SIZE_M} w{self.num_warps} s{self.num_stages}"
                + (f" r{self.maxnreg}" if self.maxnreg else ""))

    def launch_options(self):
        opts = dict(num_warps=self.num_warps, num_stages=self.num_stages)
        if self.maxnreg:
            opts["maxnreg"] = self.maxnreg
        return opts


# Off the GPU (Triton's interpreter) every tile is 16 x 16 x 16: small shapes still have
# several tiles, and several K steps, so masks and the split are exercised.
SIMULATOR_CONFIG = Config(16, 16, 16, GROUP_SIZE_M=2, num_warps=1, num_stages=1)
# On a GPU: fp16/bf16 tiles of 128 x 128 x 64, 8 warps, 3 stages, small enough in shared
# memory and registers that two programs share an SM, so one's epilogue overlaps the
# other's K loop; a 128 x 256 tile runs out of registers in libdevice's gelu epilogue and
# spills (tools/sweep_k09.py times the alternatives). fp32 with IEEE products runs on the FMA
# units: smaller tiles.
GPU_CONFIGS = {
    "fp16": Config(128, 128, 64, GROUP_SIZE_M=8, num_warps=8, num_stages=3),
    "fp32": Config(64, 64, 32, GROUP_SIZE_M=8, num_warps=4, num_stages=3),
    "epilogue": Config(32, 128, 1, num_warps=4, num_stages=1),   # the split-K second pass
}


def default_config(dtype, epilogue=False) -> Config:
    """The tile configuration for ``dtype`` on this engine (``epilogue``: the split-K
    second pass's)."""
    if not on_gpu():
        return SIMULATOR_CONFIG
    if epilogue:
        return GPU_CONFIGS["epilogue"]
    return GPU_CONFIGS["fp32"] if dtype == torch.float32 else GPU_CONFIGS["fp16"]


def split_k_rule(M, N, K, batch=1, *, block_m, block_n, block_k, sms=NOMINAL_SMS):
    """How many K slices to use: 1 (no split) unless the output tiles fill less than half
    of the GPU's SMs *and* K is long enough for every slice to keep at least
    MIN_K_ITERS_PER_SPLIT steps of the K loop. Then S = min(SMs // tiles, K steps // 8, 64),
    so that tiles * S is about one wave of CTAs.

    The price: each slice writes and the second pass reads an fp32 (batch, M, N) partial,
    2 * S * batch * M * N * 4 bytes, small next to the GEMM exactly when tiles are few.
    """
    tiles = batch * cdiv(M, block_m) * cdiv(N, block_n)
    if 2 * tiles > sms:
        return 1
    k_iters = cdiv(K, block_k)
    return max(1, min(sms // tiles, k_iters // MIN_K_ITERS_PER_SPLIT, MAX_SPLIT_K))


def blas_reads(alpha, beta):
    """(reads A and B, reads C): BLAS never reads what a zero scalar multiplies."""
    return alpha != 0.0, beta != 0.0


# ------------------------------------------------------------------------ launchers
def fused_gemm(a3, b3, c3, out, alpha=1.0, beta=0.0, bias=None, activation=None, *,
               split_k="auto", config=None):
    """``out = activation(alpha * a3 @ b3 + beta * c3 + bias)`` on 3-D operands.

    ``a3`` (B, M, K), ``b3`` (B, K, N), ``c3`` (B, M, N) or None, ``out`` (B, M, N): any
    strides, batch stride 0 for a broadcast operand (api.gemm validated and expanded them;
    nothing is copied here). ``split_k``: "auto" (:func:`split_k_rule`), or a number of K
    slices: 1 runs the one-pass kernel, 2 or more the split-K path (two kernels).
    ``config``: override the tile configuration (benchmarks, sweeps).
    """
    B, M, K = a3.shape
    N = b3.shape[2]
    if B > MAX_GRID_YZ:   # the batch is grid axis 1, at most 65535 programs: run in chunks
        for i in range(0, B, MAX_GRID_YZ):
            part = slice(i, i + MAX_GRID_YZ)
            fused_gemm(a3[part], b3[part], None if c3 is None else c3[part], out[part], alpha,
                       beta, bias, activation, split_k=split_k, config=config)
        return out
    reads_ab, reads_c = blas_reads(alpha, beta)
    act = ACTIVATION_CODES[activation]
    c_args = (c3, *c3.stride()) if reads_c else (out, 0, 0, 0)   # never dereferenced if unread
    bias_args = (bias, bias.stride(0)) if bias is not None else (out, 0)
    if split_k == "auto":
        cfg = config or default_config(a3.dtype)
        split_k = split_k_rule(M, N, K, B, block_m=cfg.BLOCK_SIZE_M, block_n=cfg.BLOCK_SIZE_N,
                               block_k=cfg.BLOCK_SIZE_K, sms=sm_count(a3.device))
    if not reads_ab:
        # alpha == 0: the K loop is skipped entirely (A and B are never read); the epilogue
        # kernel runs over zero partial sums
        _splitk_epilogue(None, 0, c_args, bias_args, out, alpha, beta, reads_c,
                         bias is not None, act)
        return out
    cfg = config or default_config(a3.dtype)
    BM, BN, BK = cfg.BLOCK_SIZE_M, cfg.BLOCK_SIZE_N, cfg.BLOCK_SIZE_K
    common = dict(IEEE=a3.dtype == torch.float32,
                  UPCAST=a3.dtype == torch.bfloat16 and simulated(),
                  BLOCK_SIZE_M=BM, BLOCK_SIZE_N=BN, BLOCK_SIZE_K=BK,
                  GROUP_SIZE_M=cfg.GROUP_SIZE_M, **cfg.launch_options())
    tiles = cdiv(M, BM) * cdiv(N, BN)
    if split_k <= 1:
        fused_gemm_kernel[(tiles, B, 1)](
            a3, b3, c_args[0], bias_args[0], out, M, N, K,
            *a3.stride(), *b3.stride(), *c_args[1:], bias_args[1], *out.stride(),
            K, 0, float(alpha), float(beta),
            HAS_C=reads_c, HAS_BIAS=bias is not None, ACTIVATION=act, IS_SPLIT=False,
            EVEN_K=K % BK == 0, **common)
        return out
    # split-K: S slices of whole BLOCK_SIZE_K steps; the last slice may be shorter
    k_per_split = cdiv(cdiv(K, split_k), BK) * BK
    S = cdiv(K, k_per_split)
    ws = torch.empty((S, B, M, N), dtype=torch.float32, device=out.device)
    fused_gemm_kernel[(tiles, B, S)](
        a3, b3, ws, ws, ws, M, N, K,
        *a3.stride(), *b3.stride(), 0, 0, 0, 0, *ws.stride()[1:],
        k_per_split, ws.stride(0), 1.0, 0.0,
        HAS_C=False, HAS_BIAS=False, ACTIVATION=0, IS_SPLIT=True,
        EVEN_K=K % BK == 0, **common)
    _splitk_epilogue(ws, S, c_args, bias_args, out, alpha, beta, reads_c, bias is not None,
                     act)
    return out


def _splitk_epilogue(ws, S, c_args, bias_args, out, alpha, beta, has_c, has_bias, act):
    """Launch the second pass: sum S partials of ``ws`` (S may be 0), then the epilogue."""
    B, M, N = out.shape
    cfg = default_config(out.dtype, epilogue=True)
    BM, BN = cfg.BLOCK_SIZE_M, cfg.BLOCK_SIZE_N
    ws_args = (ws, *ws.stride()[:3]) if ws is not None else (out, 0, 0, 0)
    grid = (cdiv(M, BM), cdiv(N, BN), B)
    splitk_epilogue_kernel[grid](
        ws_args[0], c_args[0], bias_args[0], out, M, N, S, *ws_args[1:],
        *c_args[1:], bias_args[1], *out.stride(), float(alpha), float(beta),
        HAS_C=has_c, HAS_BIAS=has_bias, ACTIVATION=act,
        BLOCK_SIZE_M=BM, BLOCK_SIZE_N=BN, num_warps=cfg.num_warps)


def gemm_auto(a3, b3, c3, out, alpha, beta, bias, activation):
    """The Kernel ``gemm`` hook of k09_fused_epilogue: one pass, split-K where the rule says."""
    return fused_gemm(a3, b3, c3, out, alpha, beta, bias, activation, split_k="auto")


def gemm_split(a3, b3, c3, out, alpha, beta, bias, activation):
    """The Kernel ``gemm`` hook of k09_split_k: always the two-pass split-K path, with the
    rule's number of slices (at least 2 where K has 2 steps)."""
    B, M, K = a3.shape
    cfg = default_config(a3.dtype)
    s = split_k_rule(M, b3.shape[2], K, B, block_m=cfg.BLOCK_SIZE_M,
                     block_n=cfg.BLOCK_SIZE_N, block_k=cfg.BLOCK_SIZE_K,
                     sms=sm_count(a3.device))
    return fused_gemm(a3, b3, c3, out, alpha, beta, bias, activation, split_k=max(2, s))


def launch(a, b, c):
    """c = a @ b through the fused kernel (alpha 1, beta 0, no bias, no activation).
    Any strides and shapes: masks and clamped indices in the kernel, no copies."""
    gemm_auto(a.unsqueeze(0), b.unsqueeze(0), None, c.unsqueeze(0), 1.0, 0.0, None, None)


def launch_split(a, b, c):
    """c = a @ b through the split-K path (two kernels). Any strides and shapes."""
    gemm_split(a.unsqueeze(0), b.unsqueeze(0), None, c.unsqueeze(0), 1.0, 0.0, None, None)


KERNELS = [
    Kernel("k09_fused_epilogue", 9, "triton", DTYPES,
           "alpha, beta*C, bias and activation fused after the K loop; batched, any strides",
           launch=launch, gemm=gemm_auto, source=fused_gemm_kernel, min_cc=(8, 0),
           features=frozenset({"alpha_beta", "bias", "activation", "batched"}),
           configs={"gpu": [GPU_CONFIGS["fp16"], GPU_CONFIGS["fp32"]],
                    "simulator": SIMULATOR_CONFIG}),
    Kernel("k09_split_k", 9, "triton", DTYPES,
           "K cut into slices on separate SMs, fp32 partials summed in a second pass, then "
           "the epilogue",
           launch=launch_split, gemm=gemm_split, source=splitk_epilogue_kernel, min_cc=(8, 0),
           features=frozenset({"alpha_beta", "bias", "activation", "batched"}),
           in_ladder=False,
           configs={"gpu": list(GPU_CONFIGS.values()), "simulator": SIMULATOR_CONFIG}),
]
