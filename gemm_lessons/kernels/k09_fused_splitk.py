"""Lesson 09, the fused epilogue on every shape: lesson 08's split-K kernel, autotuned per
shape bucket, finishing each tile with lesson 09's epilogue.

    out = act(alpha * A @ B + beta * C + bias)       bias: one value per column, (N,)

``k09_fused_epilogue`` fuses the epilogue into one fixed tile configuration, fast on large
squares; on a short output (M = 16) its few 128 x 128 tiles leave most SMs idle. This kernel
is ``k08_triton_splitk``'s, with the same configurations, pruner and autotune key, and one
change: where that kernel stores C, this one calls :func:`k09_epilogue.epilogue` on the
finished fp32 tile. Under split-K that is the program drawing the last ticket, after it has
added every slice's partial: beta * C and the bias are added once, and the activation sees
the full sum (gelu(x) + gelu(y) is not gelu(x + y)). One launch for any shape. The
epilogue runs on the tile's two halves in turn (``epilogue_in_halves``, as
``k09_fused_tma``'s): with bias and libdevice's gelu on a whole 128 x 256 or 64 x 256 tile
ptxas runs out of registers and spills (``asm_job`` compiles a config;
``compiled.ptxas_report`` reads the spills).

BLAS rules: ``beta == 0`` never reads C; ``alpha == 0`` never reads A or B (that case runs
``k09_fused_epilogue``'s epilogue pass alone). Shapes and strides: as lesson 07 (masks, no
copies); 2-D operands (``gl.gemm`` with a batch names the kernels that take one).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import cdiv, sm_count
from . import Kernel
from . import k08_triton_splitk as k08s
from . import k09_fused_epilogue as k09
from .k07_triton_swizzle import DTYPES, aligned, check_offsets, grouped_pid, operands
from .k09_epilogue import ACTIVATION_CODES, epilogue_in_halves

__all__ = ["FUSED_CONFIGS", "fused_splitk_kernel", "fused_splitk_autotuned",
           "check_epilogue_args", "overlaps", "fused_gemm", "epilogue_args",
           "tiles_by_slices", "batch_hooks", "gemm", "launch", "asm_job",
           "chosen_config"]


@triton.jit
def fused_splitk_kernel(
        # pointers to the matrices, the epilogue's bias and output, then split-K's fp32
        # workspace and per-tile counters
        a_ptr, b_ptr, c_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr,
        # dimensions: A is M x K, B is K x N, C is M x N (M_BUCKET: the autotune key's M)
        M, N, K, M_BUCKET,
        # strides: how far (in elements) to step to the next row / column of each matrix
        stride_am, stride_ak,
        stride_bk, stride_bn,
        stride_cm, stride_cn,
        stride_bias,
        stride_om, stride_on,
        # the epilogue: out = act(alpha * acc + beta * C + bias)
        alpha, beta,
        HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
        # meta-parameters: compile-time constants, one compiled kernel per combination
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,      # 1: row-major tile order; 8: grouped
        SPLIT_K: tl.constexpr,           # slices of K, one program each; 1: no split
        INPUT_PRECISION: tl.constexpr,   # "ieee" for fp32 (no TF32); "tf32" (ignored) otherwise
        DIV: tl.constexpr = (1,) * 9,    # what K, N and seven strides are multiples of
):
    # 0. what the launcher proved each size and stride a multiple of (lesson 08's split-K
    #    kernel says why: Triton proves no less than 16 itself)
    K, N = K // DIV[0] * DIV[0], N // DIV[1] * DIV[1]
    stride_am, stride_ak = stride_am // DIV[2] * DIV[2], stride_ak // DIV[3] * DIV[3]
    stride_bk, stride_bn = stride_bk // DIV[4] * DIV[4], stride_bn // DIV[5] * DIV[5]
    stride_cm, stride_om = stride_cm // DIV[6] * DIV[6], stride_om // DIV[7] * DIV[7]
    stride_on = stride_on // DIV[8] * DIV[8]

    # 1. which tile of C this program computes (see grouped_pid)
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pid_m, pid_n = grouped_pid(pid, num_pid_m, num_pid_n, GROUP_SIZE_M)
    #    and which slice of K (grid axis 1): whole K-tiles, the last slice shorter or empty
    pid_k = tl.program_id(axis=1)
    k_per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_SIZE_K) * BLOCK_SIZE_K
    k_start = pid_k * k_per_split
    k_len = tl.maximum(tl.minimum(K - k_start, k_per_split), 0)

    # 2. pointers to the first K-tile of A (BLOCK_SIZE_M x BLOCK_SIZE_K) and of B (BK x BN).
    #    Rows of A and columns of B past the edge wrap around (% M, % N): in bounds, and
    #    their results land outside C, where the store mask drops them.
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    a_ptrs += k_start * stride_ak                      # this slice's first K-tile
    b_ptrs += k_start * stride_bk

    # 3. walk the slice: load, multiply-accumulate in fp32, advance the pointers by BLOCK_SIZE_K
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(k_len, BLOCK_SIZE_K)):
        k_left = k_len - k * BLOCK_SIZE_K              # the last K-tile may be partial:
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)   # zeros past K
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)   # add nothing
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk

    # 4. a whole tile: lesson 09's epilogue while it is in registers, one half at a time
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    off_cn = pid_n * BLOCK_SIZE_N
    if SPLIT_K == 1:
        epilogue_in_halves(acc, offs_cm, off_cn, 0, M, N, c_ptr, 0, stride_cm, stride_cn,
                           bias_ptr, stride_bias, out_ptr, 0, stride_om, stride_on,
                           alpha, beta, HAS_C, HAS_BIAS, ACTIVATION, BLOCK_SIZE_N)
    else:
        # 5. split-K: park this slice's fp32 partial tile in its workspace slot (tile, slice)
        tile = (tl.arange(0, BLOCK_SIZE_M)[:, None] * BLOCK_SIZE_N
                + tl.arange(0, BLOCK_SIZE_N)[None, :])                 # (BM, BN), row-major
        slots = ws_ptr + pid.to(tl.int64) * SPLIT_K * BLOCK_SIZE_M * BLOCK_SIZE_N
        tl.store(slots + pid_k * BLOCK_SIZE_M * BLOCK_SIZE_N + tile, acc)
        tl.debug_barrier()             # every thread of the program has stored its part
        # 6. a ticket on the tile's counter: release our partial, acquire the others'
        ticket = tl.atomic_add(count_ptr + pid, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:      # the last slice to arrive adds them all up
            acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
            for s in range(0, SPLIT_K):   # in a fixed order: the same bits on every run
                acc += tl.load(slots + s * BLOCK_SIZE_M * BLOCK_SIZE_N + tile,
                               cache_modifier=".cg")   # from L2, where other SMs wrote
            # the full sum: beta * C and the bias added once, the activation on the sum
            epilogue_in_halves(acc, offs_cm, off_cn, 0, M, N, c_ptr, 0, stride_cm,
                               stride_cn, bias_ptr, stride_bias, out_ptr, 0, stride_om,
                               stride_on, alpha, beta, HAS_C, HAS_BIAS, ACTIVATION,
                               BLOCK_SIZE_N)
            tl.store(count_ptr + pid, 0)   # zero again for the next launch


# Split-K on taller tiles. The epilogue costs a program more than a plain store does, so on
# some of the suite's mid shapes about one wave of these programs beats lesson 08's configs,
# which make more, smaller ones: the autotuner picked them on an H200 for 128 x 4096 x 4096,
# 512 x 1024 x 8192 and 1024 x 1024 x 16384 (lesson 09 shows the suite).
FUSED_CONFIGS = [
    k08s.make_config(64, 64, 64, 4, 4, split_k=2),
    k08s.make_config(64, 128, 128, 4, 3, split_k=2),
    *[k08s.make_config(128, 128, 64, 8, stages, split_k=s) for stages in (3, 4)
      for s in (2, 4)],
]

# lesson 08's configurations (and those above), pruner, shape-bucket key and graph-replay timer
fused_splitk_autotuned = k08s.autotune(
    fused_splitk_kernel, configs=k08s.CONFIGS + FUSED_CONFIGS + k08s.FP32_CONFIGS)


def overlaps(x, y):
    """Whether two tensors are views of one storage (the output written over C)."""
    if x.device != y.device:
        return False
    sx, sy = x.untyped_storage(), y.untyped_storage()
    return sx.data_ptr() == sy.data_ptr()


def check_epilogue_args(N, c, alpha, beta, bias, activation):
    """A clear error for an activation, a bias or a missing C the epilogue cannot take."""
    if activation not in ACTIVATION_CODES:
        raise ValueError(f"activation must be one of {sorted(map(str, ACTIVATION_CODES))}, "
                         f"got {activation!r}")
    if bias is not None and tuple(bias.shape) != (N,):
        raise ValueError(f"bias must have shape ({N},) (one value per column), "
                         f"got {tuple(bias.shape)}")
    if k09.blas_reads(alpha, beta)[1] and c is None:
        raise ValueError("beta != 0 needs c")


def fused_gemm(a, b, c, out, alpha=1.0, beta=0.0, bias=None, activation=None, *, config=None):
    """``out = activation(alpha * a @ b + beta * c + bias)`` for 2-D ``a`` (M, K), ``b``
    (K, N), ``c`` and ``out`` (M, N) (``c`` may be None when ``beta == 0``), ``bias`` (N,)
    or None; any strides. ``config``: one ``k08_triton_splitk.make_config`` as it is,
    without tuning (tests, sweeps)."""
    M, K = a.shape
    N = b.shape[1]
    check_epilogue_args(N, c, alpha, beta, bias, activation)
    reads_ab, reads_c = k09.blas_reads(alpha, beta)
    if not reads_ab:             # alpha == 0: A and B are never read
        return k09.fused_gemm(a.unsqueeze(0), b.unsqueeze(0),
                              None if c is None else c.unsqueeze(0), out.unsqueeze(0),
                              alpha, beta, bias, activation)[0]
    if reads_c and overlaps(out, c):
        # autotuning runs the kernel several times: out += beta * C would compound
        fused_gemm(a, b, c, tmp := torch.empty_like(out), alpha, beta, bias, activation,
                   config=config)
        return out.copy_(tmp)
    check_offsets(a, b, out)
    a, b, precision = operands(a, b)
    if config is None:
        kernel, meta = fused_splitk_autotuned, {}
        ws_elems, n_counters = k08s.needs(kernel, a.dtype, M, N, K, sm_count(out.device))
    else:
        kernel = fused_splitk_kernel
        meta = dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
        ws_elems, n_counters = k08s.config_needs(config, M, N)
    ws, counts = (k08s.buffers(out.device, ws_elems, n_counters) if ws_elems else (out, out))
    c_args, bias_args = epilogue_args(c, bias, out, reads_c)
    grid = tiles_by_slices(M, N)
    div = aligned((K, N, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c_args[1],
                   out.stride(0), out.stride(1)), a.element_size())
    kernel[grid](a, b, c_args[0], bias_args[0], out, ws, counts, M, N, K, k08s.m_bucket(M),
                 a.stride(0), a.stride(1), b.stride(0), b.stride(1), *c_args[1:],
                 bias_args[1], out.stride(0), out.stride(1), float(alpha), float(beta),
                 HAS_C=reads_c, HAS_BIAS=bias is not None,
                 ACTIVATION=ACTIVATION_CODES[activation], INPUT_PRECISION=precision,
                 DIV=div, **meta)
    return out


def epilogue_args(c, bias, out, reads_c):
    """The kernel's (C, its row and column strides) and (bias, its stride); where a call has
    no C to read or no bias, the output stands in (never dereferenced) with zero strides."""
    c_args = (c, c.stride(0), c.stride(1)) if reads_c else (out, 0, 0)
    bias_args = (bias, bias.stride(0)) if bias is not None else (out, 0)
    return c_args, bias_args


def tiles_by_slices(M, N):
    """The launch grid for an M x N output, given the config Triton runs: (its tiles, its
    slices of K)."""
    def grid(meta):
        return (cdiv(M, meta["BLOCK_SIZE_M"]) * cdiv(N, meta["BLOCK_SIZE_N"]),
                meta["SPLIT_K"])
    return grid


def batch_hooks(fused_gemm):
    """The registry's two hooks of a 2-D fused launcher ``fused_gemm(a, b, c, out, alpha,
    beta, bias, activation)``: ``gemm``, for gl.gemm's 3-D views with a batch of one, and
    ``launch``, c = a @ b (alpha 1, beta 0, no bias, no activation). Both carry the
    launcher's module, which the registry's tests read."""
    def gemm(a3, b3, c3, out, alpha, beta, bias, activation):
        fused_gemm(a3[0], b3[0], None if c3 is None else c3[0], out[0], alpha, beta, bias,
                   activation)
        return out

    def launch(a, b, c):
        fused_gemm(a, b, None, c)
    for hook in (gemm, launch):
        hook.__module__ = fused_gemm.__module__
    return gemm, launch


gemm, launch = batch_hooks(fused_gemm)


def asm_job(config, dtype=torch.float16, M=2048, N=4096, K=4096, *, bias=True,
            activation="gelu", cc=(9, 0)):
    """The compilation of ``config`` with (``bias`` +) ``activation`` for ``cc``, as a
    launch on contiguous operands of this shape would specialise it (for
    :func:`gemm_lessons.triton_asm.compile_kernels`)."""
    from ..common import dtype_name
    name = dtype_name(dtype)
    split = config.kwargs["SPLIT_K"] > 1
    args = {"a_ptr": name, "b_ptr": name, "c_ptr": name, "bias_ptr": name, "out_ptr": name,
            "ws_ptr": "float32" if split else name, "count_ptr": "int32" if split else name,
            "M": M, "N": N, "K": K, "M_BUCKET": k08s.m_bucket(M),
            "stride_am": K, "stride_ak": 1, "stride_bk": N, "stride_bn": 1,
            "stride_cm": 0, "stride_cn": 0, "stride_bias": 1 if bias else 0,
            "stride_om": N, "stride_on": 1, "alpha": 1, "beta": 0}
    constants = dict(config.kwargs, HAS_C=False, HAS_BIAS=bias,
                     ACTIVATION=ACTIVATION_CODES[activation],
                     INPUT_PRECISION="ieee" if dtype == torch.float32 else "tf32")
    return dict(fn=fused_splitk_kernel, args=args, constants=constants,
                num_warps=config.num_warps, num_stages=config.num_stages, cc=cc)


def chosen_config():
    """The config the autotuner ran last (see ``k08_triton_splitk.label``)."""
    return k08s.chosen_config(fused_splitk_autotuned)


KERNELS = [
    Kernel("k09_fused_splitk", 9, "triton", DTYPES,
           "lesson 08's split-K kernel, autotuned per shape bucket, with lesson 09's "
           "epilogue after the last slice",
           launch=launch, gemm=gemm, source=fused_splitk_kernel, min_cc=(8, 0),
           features=frozenset({"alpha_beta", "bias", "activation"}), step=1, in_ladder=False,
           configs={"gpu": k08s.CONFIGS + FUSED_CONFIGS + k08s.FP32_CONFIGS,
                    "simulator": k08s.INTERPRETER_CONFIG}),
]
