"""Lesson 09's epilogue: what a GEMM does to a tile after its K loop, while the tile is still
in registers, and the second pass of split-K, which applies it once to the summed slices.

    acc = alpha * acc                           # (1) scale
    acc += beta * C_tile      if beta != 0      # (2) BLAS: beta == 0 never reads C
    acc += bias[None, :]      if bias           # (3) one value per column, shape (N,)
    acc = act(acc)                              # (4) relu / exact gelu / leaky_relu(0.01)
    out_tile = acc.to(out dtype)                # one store

``epilogue`` is called by every lesson-09 kernel: the pointer kernel
(:mod:`k09_fused_epilogue`), the TMA kernel (:mod:`k09_fused_tma`) and
``splitk_epilogue_kernel`` below. A split-K slice holds a partial sum: beta * C and the bias
must be added exactly once and the activation is non-linear, so they wait for the full sum.
"""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["ACTIVATION_CODES", "LEAKY_SLOPE", "apply_activation", "activation_kernel", "gelu",
           "gelu_libdevice", "epilogue_values", "epilogue", "epilogue_in_halves", "splitk_epilogue_kernel"]

# "gelu_libdevice": gelu computed with libdevice's erff (two polynomials, one chosen per
# element); the same function as "gelu" to fp32 rounding, kept so lesson 09 can count and
# time what its extra instructions cost
ACTIVATION_CODES = {None: 0, "relu": 1, "gelu": 2, "leaky_relu": 3, "gelu_libdevice": 4}
LEAKY_SLOPE = 0.01                      # torch.nn.functional.leaky_relu's default


@triton.jit
def gelu_libdevice(x):
    """Exact gelu through libdevice's ``erff`` (what ``tl.math.erf`` compiles to):
    x/2 * (1 + erf(x / sqrt 2)). Its ``erff`` picks one of two formulas per element with a
    branch; lesson 09 counts its instructions and times it against :func:`gelu`."""
    return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))


@triton.jit
def gelu(x):
    """Exact gelu, x * Phi(x), without a branch or a division. With a = |x|, Phi(-a) = 2 ** P(a)
    for a < 6 (and 0 beyond, where Phi(-a) < 1e-9), P the degree-10 polynomial below, fitted
    to log2 Phi(-a) by ``tools/fit_gelu.py`` (relative error of Phi(-a) under 3e-7). Then
    Phi(x) = 1 - Phi(-a) for x >= 0 and Phi(-a) for x < 0 (no cancellation on the negative
    side). Ten FMAs, one ex2 and a few selects per element, the same for every element."""
    a = tl.abs(x)
    p = -1.2274769509633537e-08                   # P(a), Horner: highest power first
    p = p * a + 4.1340144317856696e-07
    p = p * a - 5.922320904341758e-06
    p = p * a + 4.5159801868019195e-05
    p = p * a - 0.00016376428689088637
    p = p * a - 0.00026198303932372036
    p = p * a + 0.0073020112304305615
    p = p * a - 0.05271353314901633
    p = p * a - 0.459116362455275
    p = p * a - 1.151119533125292
    p = p * a - 0.9999996473264317
    tail = tl.where(a < 6.0, tl.exp2(p), 0.0)          # Phi(-|x|)
    return x * tl.where(x >= 0, 1.0 - tail, tail)


@triton.jit
def apply_activation(x, ACTIVATION: tl.constexpr):
    """The activation on an fp32 tile, as torch computes it (NaN stays NaN)."""
    if ACTIVATION == 1:    # relu
        x = tl.where(x < 0, 0.0, x)
    elif ACTIVATION == 2:  # gelu, exact (torch's default): x * Phi(x), branch-free
        x = gelu(x)
    elif ACTIVATION == 3:  # leaky_relu, slope 0.01
        x = tl.where(x < 0, x * 0.01, x)
    elif ACTIVATION == 4:  # the same gelu through libdevice's erff (to time the difference)
        x = gelu_libdevice(x)
    return x


@triton.jit
def activation_kernel(x_ptr, y_ptr, n, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
    """y = act(x) on a vector of n fp32 values: the activation alone, to test it and to count
    its instructions (lesson 09 compiles it with one element per thread)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, apply_activation(x, ACTIVATION), mask=offs < n)


@triton.jit
def epilogue_values(acc, offs_m, offs_n, pid_b, M, N,
                    c_ptr, stride_cb, stride_cm, stride_cn,
                    bias_ptr, stride_bias,
                    alpha, beta,
                    HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """act(alpha * acc + beta * C + bias) on one tile, in fp32, not yet stored."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    rows = offs_m[:, None].to(tl.int64)                    # 64-bit: outputs over 2**31 elements
    acc = acc * alpha                                      # (1)
    if HAS_C:                                              # (2) beta == 0: C is never loaded
        c_ptrs = c_ptr + pid_b * stride_cb + rows * stride_cm + offs_n[None, :] * stride_cn
        c = tl.load(c_ptrs, mask=mask, other=0.0)
        acc += beta * c.to(tl.float32)
    if HAS_BIAS:                                           # (3) bias: (N,), one per column
        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    return apply_activation(acc, ACTIVATION)              # (4)


@triton.jit
def epilogue(acc, offs_m, offs_n, pid_b, M, N,
              c_ptr, stride_cb, stride_cm, stride_cn,
              bias_ptr, stride_bias,
              out_ptr, stride_ob, stride_om, stride_on,
              alpha, beta,
              HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    """out = act(alpha * acc + beta * C + bias) on one (BLOCK_SIZE_M, BLOCK_SIZE_N) tile."""
    acc = epilogue_values(acc, offs_m, offs_n, pid_b, M, N, c_ptr, stride_cb, stride_cm,
                          stride_cn, bias_ptr, stride_bias, alpha, beta,
                          HAS_C, HAS_BIAS, ACTIVATION)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    rows = offs_m[:, None].to(tl.int64)
    out_ptrs = out_ptr + pid_b * stride_ob + rows * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def epilogue_in_halves(acc, offs_m, off_n, pid_b, M, N,
                       c_ptr, stride_cb, stride_cm, stride_cn,
                       bias_ptr, stride_bias,
                       out_ptr, stride_ob, stride_om, stride_on,
                       alpha, beta,
                       HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
                       BLOCK_SIZE_N: tl.constexpr):
    """:func:`epilogue` on the tile's two (BLOCK_SIZE_M, BLOCK_SIZE_N / 2) halves, one after
    the other (columns ``off_n`` onwards): on a 128 x 256 tile the whole-tile gelu needs
    more registers than a thread may have with libdevice's gelu, and spills; the halves leave
    room."""
    acc0, acc1 = tl.split(tl.permute(tl.reshape(acc, (acc.shape[0], 2, BLOCK_SIZE_N // 2)),
                                     (0, 2, 1)))
    offs_n = off_n + tl.arange(0, BLOCK_SIZE_N // 2)
    epilogue(acc0, offs_m, offs_n, pid_b, M, N, c_ptr, stride_cb, stride_cm, stride_cn,
             bias_ptr, stride_bias, out_ptr, stride_ob, stride_om, stride_on, alpha, beta,
             HAS_C, HAS_BIAS, ACTIVATION)
    epilogue(acc1, offs_m, offs_n + BLOCK_SIZE_N // 2, pid_b, M, N, c_ptr, stride_cb,
             stride_cm, stride_cn, bias_ptr, stride_bias, out_ptr, stride_ob, stride_om,
             stride_on, alpha, beta, HAS_C, HAS_BIAS, ACTIVATION)


@triton.jit
def splitk_epilogue_kernel(
        # pointers: ws holds SPLIT_K fp32 partial sums, (SPLIT_K, batch, M, N) contiguous
        ws_ptr, c_ptr, bias_ptr, out_ptr,
        # dimensions; SPLIT_K == 0 means alpha == 0: no partials, A and B were never read
        M, N, SPLIT_K,
        # strides
        stride_ws, stride_wb, stride_wm,
        stride_cb, stride_cm, stride_cn,
        stride_bias,
        stride_ob, stride_om, stride_on,
        # BLAS scalars
        alpha, beta,
        # meta-parameters
        HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """Second pass of split-K: sum the slices in a fixed order, then the epilogue, once."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ws_ptrs = (ws_ptr + pid_b * stride_wb + offs_m[:, None].to(tl.int64) * stride_wm
               + offs_n[None, :])
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for s in range(0, SPLIT_K):
        acc += tl.load(ws_ptrs, mask=mask, other=0.0)
        ws_ptrs += stride_ws
    epilogue(acc, offs_m, offs_n, pid_b, M, N,
             c_ptr, stride_cb, stride_cm, stride_cn, bias_ptr, stride_bias,
             out_ptr, stride_ob, stride_om, stride_on, alpha, beta,
             HAS_C, HAS_BIAS, ACTIVATION)
