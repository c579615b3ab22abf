"""Lesson 09, the fused epilogue on every shape, fed by TMA: ``k09_fused_splitk`` with
lesson 08's TMA descriptor loads in its K loop.

    out = act(alpha * A @ B + beta * C + bias)       bias: one value per column, (N,)

``k09_fused_splitk`` walks its slice of K with pointer loads: every thread computes the
addresses of its part of each A and B tile and issues its own copies, and the masks cut the
ragged edges. This kernel changes only that loop. A and B are read through TMA descriptors
(lesson 08's ``k08_triton_tma``): one bulk copy per tile, issued by one thread, the copy
engine filling zeros past M, N and K, so the loop has no address arithmetic and no masks.
The grid, the slices of K (now counted in whole K-tiles), the ticketed reduction and the
epilogue are ``k09_fused_splitk``'s. Unlike ``k09_fused_tma`` the grid is not persistent:
on the suite's mid shapes one program per tile and slice, in one or two waves, is what wins.

Configurations (:data:`TMA_CONFIGS`): ``k09_fused_splitk``'s and seven more, under lesson 08's
pruner and shape-bucket key, with the layout flags ``A_TRANS`` and ``B_TRANS`` added to the
key (``W.t()`` is another compiled kernel, tuned apart). A descriptor's
block is the config's tile, so each config carries a ``pre_hook`` that sets the blocks of
the two descriptors before the autotuner runs it.

Where the TMA kernel is not used, ``k09_fused_splitk`` runs (the same slices, reduction and
epilogue, pointer loads): an operand a descriptor cannot address in place (its base, or a
stride other than the unit one, not a multiple of 16 bytes: see ``k09_fused_tma``), and for
other reasons fp32 operands (the configurations are fp16/bf16 ones), ``alpha == 0`` (no K
loop) and an output written over C. :func:`uses_tma` says which path a call takes. B may be
given as the transposed weight ``W.t()`` of an ``nn.Linear``: the descriptor is built on
``W`` and the tile transposed in shared memory (``k09_fused_tma``'s ``load_tile``). 2-D
operands.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import dtype_name, sm_count
from . import FP16_BF16, Kernel
from . import k08_triton_splitk as k08s
from . import k09_fused_epilogue as k09
from . import k09_fused_splitk as fsk
from .k07_triton_swizzle import check_offsets, grouped_pid, operands
from .k09_epilogue import ACTIVATION_CODES, epilogue_in_halves
from .k09_fused_tma import as_descriptor, load_tile

__all__ = ["fused_tma_splitk_kernel", "TMA_CONFIGS", "INTERPRETER_CONFIG",
           "fused_tma_splitk_autotuned", "set_blocks", "uses_tma", "fused_gemm", "gemm", "launch",
           "asm_job", "chosen_config"]


@triton.jit
def fused_tma_splitk_kernel(
        # TMA descriptors of A and B (or of their transposes), pointers to C, the epilogue's
        # bias and output, then split-K's fp32 workspace and per-tile counters
        a_desc, b_desc, c_ptr, bias_ptr, out_ptr, ws_ptr, count_ptr,
        # dimensions: A is M x K, B is K x N, C is M x N (M_BUCKET: the autotune key's M)
        M, N, K, M_BUCKET,
        # strides: how far (in elements) to step to the next row / column of each matrix
        stride_cm, stride_cn,
        stride_bias,
        stride_om, stride_on,
        # the epilogue: out = act(alpha * acc + beta * C + bias)
        alpha, beta,
        HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
        A_TRANS: tl.constexpr, B_TRANS: tl.constexpr,   # a descriptor of the transpose
        # meta-parameters: compile-time constants, one compiled kernel per combination
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,      # 1: row-major tile order; 8: grouped
        SPLIT_K: tl.constexpr,           # slices of K, one program each; 1: no split
        INPUT_PRECISION: tl.constexpr,   # "ieee" for fp32 (no TF32); "tf32" (ignored) otherwise
):
    # 1. which tile of C this program computes (see grouped_pid)
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    pid_m, pid_n = grouped_pid(pid, num_pid_m, num_pid_n, GROUP_SIZE_M)
    #    and which slice of K (grid axis 1): K-tiles k_first .. k_last - 1, the last slice
    #    shorter or empty
    pid_k = tl.program_id(axis=1)
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    per_slice = tl.cdiv(k_tiles, SPLIT_K)
    k_first = pid_k * per_slice
    k_last = tl.minimum(k_first + per_slice, k_tiles)

    # 2. the tile's corner; past M, N or K the copy engine fills zeros (no masks, no % M)
    off_m = pid_m * BLOCK_SIZE_M
    off_n = pid_n * BLOCK_SIZE_N

    # 3. walk the slice: one TMA copy per operand tile, multiply-accumulate in fp32
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for ki in range(k_first, k_last):
        a = load_tile(a_desc, 0, off_m, ki * BLOCK_SIZE_K, BLOCK_SIZE_M, BLOCK_SIZE_K,
                       False, A_TRANS)
        b = load_tile(b_desc, 0, ki * BLOCK_SIZE_K, off_n, BLOCK_SIZE_K, BLOCK_SIZE_N,
                       False, B_TRANS)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

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


# ------------------------------------------------------------------ configurations
def set_blocks(nargs):
    """A config's ``pre_hook``: the two descriptors' blocks become its tiles (transposed for
    an operand read through its transpose)."""
    BM, BN, BK = nargs["BLOCK_SIZE_M"], nargs["BLOCK_SIZE_N"], nargs["BLOCK_SIZE_K"]
    nargs["a_desc"].block_shape = [BK, BM] if nargs["A_TRANS"] else [BM, BK]
    nargs["b_desc"].block_shape = [BN, BK] if nargs["B_TRANS"] else [BK, BN]


def _with_blocks(c):
    """``c`` (a ``k08_triton_splitk.make_config``) carrying the :func:`set_blocks` pre_hook."""
    return triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages,
                         pre_hook=set_blocks)


# fp16 / bf16: k09_fused_splitk's configurations and seven more, each the fastest of a sweep
# with TMA loads on some mid shape of the suite (gemm_lessons.shapes.SHAPES_LLM, on an H200):
# 128 x 128 x 128 with 3 stages, unsplit and split in two; 128 x 128 x 64 split in two with
# 5 stages; 64 x 128 x 64 with 5 stages (split 1, 2, 4) and 6 stages (split 2). Deeper tiles
# halve the K-steps; more stages keep more copies in flight.
TMA_CONFIGS = [_with_blocks(c) for c in k08s.CONFIGS + fsk.FUSED_CONFIGS + [
    *[k08s.make_config(128, 128, 128, 8, 3, split_k=s) for s in (1, 2)],
    k08s.make_config(128, 128, 64, 8, 5, split_k=2),
    *[k08s.make_config(64, 128, 64, 4, 5, split_k=s) for s in (1, 2, 4)],
    k08s.make_config(64, 128, 64, 4, 6, split_k=2),
]]
# Triton's interpreter: lesson 08's small config that splits K in two, the one its pruner
# keeps there (the launcher gives the descriptors its blocks)
INTERPRETER_CONFIG = k08s.INTERPRETER_CONFIG

# lesson 08's pruner and shape-bucket key (the pruner reads the dtype off a descriptor), and
# the operands' layouts: W.t() compiles another kernel (B_TRANS), which is tuned on its own
fused_tma_splitk_autotuned = k08s.autotune(fused_tma_splitk_kernel, configs=TMA_CONFIGS,
                                           extra_key=("A_TRANS", "B_TRANS"))


def _tma_operands(a, b, config):
    """(a, b, precision, (a_desc, a_trans), (b_desc, b_trans)), or None where a descriptor
    cannot address ``a`` or ``b`` in place. Blocks: ``config``'s (its pre_hook sets them
    again for every config the autotuner runs)."""
    cfg = config.kwargs
    blocks = ((cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_K"]), (cfg["BLOCK_SIZE_K"], cfg["BLOCK_SIZE_N"]))

    def describe(*ops):
        return [as_descriptor(t.unsqueeze(0), *blk, 1) for t, blk in zip(ops, blocks)]
    descs = describe(a, b)               # decided on the operands as given
    if None in descs:
        return None
    wa, wb, precision = operands(a, b)
    if wa is not a:                      # the interpreter widened bf16 to fp32 copies
        descs = describe(wa, wb)
        if None in descs:
            return None
    da, db = descs
    return wa, wb, precision, da[::2], db[::2]


def _may_use_tma(a, c, out, alpha, beta):
    reads_ab, reads_c = k09.blas_reads(alpha, beta)
    overlap = reads_c and out is not None and c is not None and fsk.overlaps(out, c)
    return reads_ab and a.dtype in FP16_BF16 and not overlap


def uses_tma(a, b, c=None, out=None, alpha=1.0, beta=0.0):
    """Whether :func:`fused_gemm` runs the TMA kernel on these operands (True), or
    ``k09_fused_splitk``'s pointer kernel (False; see the module docstring)."""
    return (_may_use_tma(a, c, out, alpha, beta)
            and _tma_operands(a, b, INTERPRETER_CONFIG) is not None)


def fused_gemm(a, b, c, out, alpha=1.0, beta=0.0, bias=None, activation=None, *, config=None):
    """``out = activation(alpha * a @ b + beta * c + bias)`` for 2-D ``a`` (M, K), ``b``
    (K, N), ``c`` and ``out`` (M, N) (``c`` may be None when ``beta == 0``), ``bias`` (N,)
    or None; any strides (what TMA cannot address runs ``k09_fused_splitk``). ``config``:
    one config of :data:`TMA_CONFIGS` (or ``k08_triton_splitk.make_config``) as it is,
    without tuning (tests, sweeps)."""
    M, K = a.shape
    N = b.shape[1]
    fsk.check_epilogue_args(N, c, alpha, beta, bias, activation)
    reads_ab, reads_c = k09.blas_reads(alpha, beta)
    found = (_tma_operands(a, b, config or INTERPRETER_CONFIG)
             if _may_use_tma(a, c, out, alpha, beta) else None)
    if found is None:
        return fsk.fused_gemm(a, b, c, out, alpha, beta, bias, activation, config=config)
    a, b, precision, (a_desc, a_trans), (b_desc, b_trans) = found
    check_offsets(out, *([c] if reads_c else []))
    if config is None:
        kernel, meta = fused_tma_splitk_autotuned, {}
        ws_elems, n_counters = k08s.needs(kernel, a.dtype, M, N, K, sm_count(out.device))
    else:
        set_blocks({**config.kwargs, "a_desc": a_desc, "b_desc": b_desc,
                    "A_TRANS": a_trans, "B_TRANS": b_trans})
        kernel = fused_tma_splitk_kernel
        meta = dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
        ws_elems, n_counters = k08s.config_needs(config, M, N)
    ws, counts = (k08s.buffers(out.device, ws_elems, n_counters) if ws_elems else (out, out))
    c_args, bias_args = fsk.epilogue_args(c, bias, out, reads_c)
    grid = fsk.tiles_by_slices(M, N)
    kernel[grid](a_desc, b_desc, c_args[0], bias_args[0], out, ws, counts, M, N, K,
                 k08s.m_bucket(M), *c_args[1:], bias_args[1], out.stride(0), out.stride(1),
                 float(alpha), float(beta), HAS_C=reads_c, HAS_BIAS=bias is not None,
                 ACTIVATION=ACTIVATION_CODES[activation], A_TRANS=a_trans, B_TRANS=b_trans,
                 INPUT_PRECISION=precision, **meta)
    return out


gemm, launch = fsk.batch_hooks(fused_gemm)


def asm_job(config, dtype=torch.float16, M=512, N=4096, K=14336, *, bias=True,
            activation="gelu", cc=(9, 0)):
    """The compilation of ``config`` with (``bias`` +) ``activation`` for ``cc``, on
    contiguous operands of this shape (for :func:`gemm_lessons.triton_asm.compile_kernels`)."""
    BM, BN, BK = (config.kwargs[k] for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"))
    name = dtype_name(dtype)
    split = config.kwargs["SPLIT_K"] > 1
    args = {"a_desc": {"desc": name, "block": [BM, BK]},
            "b_desc": {"desc": name, "block": [BK, BN]},
            "c_ptr": name, "bias_ptr": name, "out_ptr": name,
            "ws_ptr": "float32" if split else name, "count_ptr": "int32" if split else name,
            "M": M, "N": N, "K": K, "M_BUCKET": k08s.m_bucket(M),
            "stride_cm": 0, "stride_cn": 0, "stride_bias": 1 if bias else 0,
            "stride_om": N, "stride_on": 1, "alpha": 1, "beta": 0}
    constants = dict(config.kwargs, HAS_C=False, HAS_BIAS=bias,
                     ACTIVATION=ACTIVATION_CODES[activation], A_TRANS=False, B_TRANS=False,
                     INPUT_PRECISION="tf32")
    return dict(fn=fused_tma_splitk_kernel, args=args, constants=constants,
                num_warps=config.num_warps, num_stages=config.num_stages, cc=cc)


def chosen_config():
    """The config the autotuner ran last (see ``k08_triton_splitk.label``)."""
    return k08s.chosen_config(fused_tma_splitk_autotuned)


KERNELS = [
    Kernel("k09_fused_tma_splitk", 9, "triton", FP16_BF16,
           "k09_fused_splitk with lesson 08's TMA loads in its K loop (Hopper); "
           "B row-major or W.t()",
           launch=launch, gemm=gemm, source=fused_tma_splitk_kernel, min_cc=(9, 0),
           features=frozenset({"alpha_beta", "bias", "activation"}), step=2,
           in_ladder=False,
           configs={"gpu": TMA_CONFIGS, "simulator": INTERPRETER_CONFIG}),
]
