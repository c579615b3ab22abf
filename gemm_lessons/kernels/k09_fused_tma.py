"""Lesson 09 on Hopper: the fused epilogue on lesson 08's TMA loads and persistent grid.

``k09_fused_tma`` computes exactly what ``k09_fused_epilogue`` computes,
``out = activation(alpha * A @ B + beta * C + bias)``, batched, with the same epilogue
function (``k09_epilogue.epilogue``: ``beta == 0`` never loads C, bias (N,), relu /
exact gelu / leaky_relu, one rounding, a masked store). Only the K loop and the tile
schedule differ, and they are lesson 08's (``k08_triton_tma``):

* **TMA descriptor loads.** A and B reach shared memory as bulk tensor copies
  (``desc.load([row, col])``: one instruction per tile, no per-thread addresses, no masks;
  the copy engine fills the part of a tile outside the operand with zeros, so ragged M, N
  and K need no masks in the K loop). B may be row-major (K, N) or K-major, i.e. the
  transposed weight ``W.t()`` of an (N, K) ``nn.Linear`` weight: the descriptor is built on
  ``W`` itself (``B_TRANS``) and the tile is transposed in shared memory (``b.T``, free for
  wgmma), so no copy is made. A column-major A is handled the same way (``A_TRANS``).
* **A persistent grouped grid.** ``min(SMs, tiles)`` programs; program ``p`` computes tiles
  ``p, p + NUM_SMS, ...`` of all batches, each in lesson 07's grouped order within its
  batch. Programs start once, and Triton pipelines across tile boundaries (``flatten``):
  the next tile's first loads are in flight during this tile's epilogue.

The epilogue stores through pointers (masked), as k09_fused_epilogue does, so C, bias and
the output may have any strides. ``EPILOGUE_SUBTILE`` (on in every configuration) runs
the epilogue on the two halves of the tile one after the other: on the GPU's 128 x 256
tile the whole-tile epilogue with libdevice's gelu needs more registers than a thread may
have and spills; the halves leave room (``asm_job`` compiles it: ptxas's report shows
registers and spills).

Batches: ``gl.gemm`` hands the kernel (B, M, K) and (B, K, N) views. An operand with a
real batch (batch stride not 0) gets a 3-D descriptor, (B, rows, cols) with a block of
(1, rows, cols); a broadcast operand (batch stride 0, or B == 1) gets a 2-D descriptor of
its one matrix, so nothing is copied and the stride-0 batch never reaches the copy engine.
The batch index is part of the persistent loop (no grid-axis limit on B).

What TMA cannot address falls back to ``k09_fused_epilogue``'s pointer kernel (the same
epilogue, same results), with **no copy**: a descriptor needs a 16-byte-aligned base, one
unit stride (the last, or the row stride for a transposed operand) and every other stride
a multiple of 16 bytes. So K (or M, N for the transposed cases) not a multiple of 8 fp16
elements, an odd slice, or a batch stride that is not a multiple of 8 elements runs the
pointer kernel. ``will_use_tma(a3, b3)`` says which path an operand pair takes. The
reason for falling back rather than copying into padded rows (as lesson 08's ``tma_view``
does): ``gl.gemm`` promises no hidden copies, and a copy of A or B costs about what the
epilogue saves. Also delegated to the pointer kernel: ``alpha == 0`` (the epilogue alone
runs; A and B are never read) and split-K (``k09_split_k``), since a persistent grid with
few tiles is exactly the case split-K exists for.

dtypes: fp16 and bf16. Needs sm_90 (TMA) on a GPU. Engines: Triton's interpreter runs the
same kernel with small tiles and 3 pretend multiprocessors (so programs loop over tiles);
there bf16 tiles are widened to fp32 after the load (``UPCAST``), as in k09_fused_epilogue.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import engines
from ..common import cdiv, dtype_name, simulated, sm_count, wave_tile
from . import FP16_BF16, Kernel
from . import k09_fused_epilogue as k09
from .k07_triton_swizzle import grouped_pid
from .k08_triton_tma import persistent_programs, tma_ready
from .k09_epilogue import epilogue_in_halves

__all__ = ["fused_tma_kernel", "TmaConfig", "GPU_CONFIG", "NARROW_CONFIG", "SIM_CONFIG", "default_config",
           "load_tile", "as_descriptor", "will_use_tma", "fused_gemm_tma", "gemm_tma", "launch",
           "asm_job"]


# ----------------------------------------------------------------------------- kernel
@triton.jit
def load_tile(desc, batch, row, col, ROWS: tl.constexpr, COLS: tl.constexpr,
               IS_3D: tl.constexpr, TRANS: tl.constexpr):
    """The (ROWS, COLS) tile at (row, col) of one operand, by one TMA copy. ``TRANS``: the
    descriptor describes the operand's transpose (its storage), so the (COLS, ROWS) tile is
    loaded and transposed in shared memory. ``IS_3D``: the descriptor has a batch axis."""
    if TRANS:
        if IS_3D:
            t = desc.load([batch, col, row]).reshape(COLS, ROWS)
        else:
            t = desc.load([col, row])
        return t.T
    else:
        if IS_3D:
            return desc.load([batch, row, col]).reshape(ROWS, COLS)
        else:
            return desc.load([row, col])


@triton.jit
def fused_tma_kernel(
        # TMA descriptors of A and B (2-D, or 3-D with a batch axis; see A_3D, A_TRANS)
        a_desc, b_desc,
        # pointers of the epilogue: C (read only if HAS_C), bias, the output
        c_ptr, bias_ptr, out_ptr,
        # dimensions; BATCH is the number of output matrices
        M, N, K, BATCH,
        # strides of the epilogue's operands: (batch, row, column)
        stride_cb, stride_cm, stride_cn,
        stride_bias,
        stride_ob, stride_om, stride_on,
        # BLAS scalars
        alpha, beta,
        # meta-parameters
        HAS_C: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
        A_3D: tl.constexpr, B_3D: tl.constexpr, A_TRANS: tl.constexpr, B_TRANS: tl.constexpr,
        UPCAST: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr, FLATTEN: tl.constexpr,
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,
        NUM_SMS: tl.constexpr):          # the loop's step; the grid is min(NUM_SMS, tiles)
    """Persistent: this program computes tiles pid, pid + NUM_SMS, ... of every batch; each
    tile is lesson 08's TMA K loop followed by lesson 09's epilogue."""
    start_pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    tiles_per_batch = num_pid_m * num_pid_n
    num_tiles = tiles_per_batch * BATCH
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=FLATTEN):
        pid_b = tile_id // tiles_per_batch
        pid_m, pid_n = grouped_pid(tile_id % tiles_per_batch, num_pid_m, num_pid_n,
                                   GROUP_SIZE_M)
        off_m = pid_m * BLOCK_SIZE_M
        off_n = pid_n * BLOCK_SIZE_N
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)   # fresh every tile
        for ki in range(k_tiles):
            # one bulk copy per operand tile; past M, N or K the copy engine fills zeros
            a = load_tile(a_desc, pid_b, off_m, ki * BLOCK_SIZE_K, BLOCK_SIZE_M,
                           BLOCK_SIZE_K, A_3D, A_TRANS)
            b = load_tile(b_desc, pid_b, ki * BLOCK_SIZE_K, off_n, BLOCK_SIZE_K,
                           BLOCK_SIZE_N, B_3D, B_TRANS)
            if UPCAST:   # only in Triton's CPU interpreter, which has no bf16 matmul
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc)
        # lesson 09's epilogue, unchanged: alpha, beta * C, bias, activation, one store
        offs_m = off_m + tl.arange(0, BLOCK_SIZE_M)
        if EPILOGUE_SUBTILE:   # two (BM, BN / 2) halves, one after the other
            epilogue_in_halves(acc, offs_m, off_n, pid_b.to(tl.int64), M, N,
                               c_ptr, stride_cb, stride_cm, stride_cn, bias_ptr, stride_bias,
                               out_ptr, stride_ob, stride_om, stride_on, alpha, beta,
                               HAS_C, HAS_BIAS, ACTIVATION, BLOCK_SIZE_N)
        else:
            offs_n = off_n + tl.arange(0, BLOCK_SIZE_N)
            k09.epilogue(acc, offs_m, offs_n, pid_b.to(tl.int64), M, N,
                         c_ptr, stride_cb, stride_cm, stride_cn, bias_ptr, stride_bias,
                         out_ptr, stride_ob, stride_om, stride_on, alpha, beta,
                         HAS_C, HAS_BIAS, ACTIVATION)


# ------------------------------------------------------------------------ configuration
@dataclass(frozen=True)
class TmaConfig(k09.Config):
    """k09's Config plus the persistent kernel's options."""
    epilogue_subtile: bool = False      # the epilogue on two halves of the tile
    flatten: bool = True                # pipeline across tile boundaries

    def __str__(self):
        return (super().__str__() + (" sub" if self.epilogue_subtile else "")
                + ("" if self.flatten else " noflat"))


# On a GPU: 128 x 256 x 64 tiles, 8 warps, 3 stages (one program per SM). The gelu
# epilogue on the whole 128 x 256 tile spills with libdevice's gelu; on two 128 x 128
# halves it does not, and the halves are the default (tools/sweep_k09.py times the
# alternatives).
GPU_CONFIG = TmaConfig(128, 256, 64, GROUP_SIZE_M=8, num_warps=8, num_stages=3,
                       epilogue_subtile=True)
# where 128 x 256 tiles fill the persistent grid's waves poorly (lesson 08's NARROW_CONFIG,
# :func:`gemm_lessons.common.wave_tile`): 128 x 128 x 64, 8 warps, 4 stages
NARROW_CONFIG = TmaConfig(128, 128, 64, GROUP_SIZE_M=8, num_warps=8, num_stages=4,
                          epilogue_subtile=True)
# the interpreter: small tiles (k08's persistent_programs: 3 programs), so programs loop
# over tiles; the same epilogue on two halves as on the GPU
SIM_CONFIG = TmaConfig(16, 16, 16, GROUP_SIZE_M=2, num_warps=1, num_stages=1,
                       epilogue_subtile=True)


def default_config(M=None, N=None, batch=1, sms=None) -> TmaConfig:
    """The configuration a call runs: on a GPU :data:`GPU_CONFIG`, or :data:`NARROW_CONFIG`
    for an M x N output (``batch`` of them) whose 128 x 256 tiles fill the waves of ``sms``
    programs poorly; :data:`SIM_CONFIG` on the interpreter."""
    if not engines.on_gpu():
        return SIM_CONFIG
    if M is None:
        return GPU_CONFIG
    configs = (GPU_CONFIG, NARROW_CONFIG)
    tiles = [(c.BLOCK_SIZE_M, c.BLOCK_SIZE_N) for c in configs]
    return configs[tiles.index(wave_tile(M, N, tiles, sms or sm_count(), batch))]


# ------------------------------------------------------------------------ launcher
def as_descriptor(t3, block_rows, block_cols, batch):
    """A TMA descriptor of one operand, t3 of shape (B, rows, cols), and how it is read:
    (descriptor, is_3d, trans), or None if TMA cannot address it in place.

    Broadcast (batch stride 0) or a single batch: a 2-D descriptor of t3[0]. Otherwise 3-D.
    trans: t3's rows are contiguous (column-major matrices): the descriptor describes the
    transpose, with the block transposed too."""
    one = t3[0]
    for trans in (False, True):
        mat = one.t() if trans else one                # the storage: unit last stride
        if tma_ready(mat):
            break
    else:
        return None
    block = [block_cols, block_rows] if trans else [block_rows, block_cols]
    is_3d = batch > 1 and t3.stride(0) != 0
    if not is_3d:
        return TensorDescriptor.from_tensor(mat, block), False, trans
    bstride = t3.stride(0)
    size = t3.element_size()
    if (bstride * size) % 16 or bstride < mat.shape[0] * mat.stride(0):
        return None                                    # misaligned or overlapping batches
    return (TensorDescriptor(t3, [t3.shape[0], *mat.shape], [bstride, *mat.stride()],
                             [1, *block]), True, trans)


def will_use_tma(a3, b3, alpha=1.0):
    """Whether :func:`fused_gemm_tma` runs the TMA kernel on these (B, M, K), (B, K, N)
    operands (True), or falls back to k09_fused_epilogue's pointer kernel (False)."""
    cfg = default_config()
    B = a3.shape[0]
    return (alpha != 0.0
            and as_descriptor(a3, cfg.BLOCK_SIZE_M, cfg.BLOCK_SIZE_K, B) is not None
            and as_descriptor(b3, cfg.BLOCK_SIZE_K, cfg.BLOCK_SIZE_N, B) is not None)


def fused_gemm_tma(a3, b3, c3, out, alpha=1.0, beta=0.0, bias=None, activation=None, *,
                   config=None, sms=None):
    """``out = activation(alpha * a3 @ b3 + beta * c3 + bias)`` with :func:`fused_tma_kernel`.

    ``a3`` (B, M, K), ``b3`` (B, K, N), ``c3`` (B, M, N) or None, ``out`` (B, M, N), as
    api.gemm hands them over (batch stride 0 for a broadcast operand). ``config``: a
    :class:`TmaConfig` (sweeps); ``sms``: the persistent grid's size (default: this GPU's
    multiprocessors). Falls back to k09_fused_epilogue (no copy) where the module docstring
    says so."""
    B, M, K = a3.shape
    N = b3.shape[2]
    reads_ab, reads_c = k09.blas_reads(alpha, beta)
    sms = persistent_programs(out.device) if sms is None else sms
    cfg = config or default_config(M, N, B, sms)
    da = as_descriptor(a3, cfg.BLOCK_SIZE_M, cfg.BLOCK_SIZE_K, B) if reads_ab else None
    db = as_descriptor(b3, cfg.BLOCK_SIZE_K, cfg.BLOCK_SIZE_N, B) if reads_ab else None
    if da is None or db is None:
        # alpha == 0 (A and B never read) or an operand TMA cannot address: the pointer
        # kernel, one pass, same epilogue
        return k09.fused_gemm(a3, b3, c3, out, alpha, beta, bias, activation, split_k=1)
    (a_desc, a_3d, a_trans), (b_desc, b_3d, b_trans) = da, db
    c_args = (c3, *c3.stride()) if reads_c else (out, 0, 0, 0)   # never loaded if unread
    bias_args = (bias, bias.stride(0)) if bias is not None else (out, 0)
    tiles = B * cdiv(M, cfg.BLOCK_SIZE_M) * cdiv(N, cfg.BLOCK_SIZE_N)
    fused_tma_kernel[(min(sms, tiles),)](
        a_desc, b_desc, c_args[0], bias_args[0], out, M, N, K, B,
        *c_args[1:], bias_args[1], *out.stride(), float(alpha), float(beta),
        HAS_C=reads_c, HAS_BIAS=bias is not None,
        ACTIVATION=k09.ACTIVATION_CODES[activation],
        A_3D=a_3d, B_3D=b_3d, A_TRANS=a_trans, B_TRANS=b_trans,
        UPCAST=a3.dtype == torch.bfloat16 and simulated(),
        EPILOGUE_SUBTILE=cfg.epilogue_subtile, FLATTEN=cfg.flatten,
        BLOCK_SIZE_M=cfg.BLOCK_SIZE_M, BLOCK_SIZE_N=cfg.BLOCK_SIZE_N,
        BLOCK_SIZE_K=cfg.BLOCK_SIZE_K, GROUP_SIZE_M=cfg.GROUP_SIZE_M, NUM_SMS=sms,
        **cfg.launch_options())
    return out


def gemm_tma(a3, b3, c3, out, alpha, beta, bias, activation):
    """The Kernel ``gemm`` hook of k09_fused_tma."""
    return fused_gemm_tma(a3, b3, c3, out, alpha, beta, bias, activation)


def launch(a, b, c):
    """c = a @ b through the TMA kernel (alpha 1, beta 0, no bias, no activation); the
    pointer kernel where TMA cannot address an operand (see the module docstring)."""
    gemm_tma(a.unsqueeze(0), b.unsqueeze(0), None, c.unsqueeze(0), 1.0, 0.0, None, None)


# ------------------------------------------------------------------------ instruments
def asm_job(dtype=torch.float16, *, config=None, cc=(9, 0), size=4096, sms=132,
            batched=False, b_trans=False, activation="gelu", bias=True):
    """The compilation of the GPU configuration for ``cc`` (for
    :func:`gemm_lessons.triton_asm.compile_kernels`): (``bias`` +) ``activation``,
    contiguous ``size``-cubed operands; ``batched``: 3-D descriptors; ``b_trans``: B given
    as W.t()."""
    cfg = config or GPU_CONFIG
    name = dtype_name(dtype)
    lead = [1] if batched else []
    b_block = [cfg.BLOCK_SIZE_N, cfg.BLOCK_SIZE_K] if b_trans else \
        [cfg.BLOCK_SIZE_K, cfg.BLOCK_SIZE_N]
    args = {"a_desc": {"desc": name, "block": lead + [cfg.BLOCK_SIZE_M, cfg.BLOCK_SIZE_K]},
            "b_desc": {"desc": name, "block": lead + b_block},
            "c_ptr": name, "bias_ptr": name, "out_ptr": name,
            "M": size, "N": size, "K": size, "BATCH": 4 if batched else 1,
            "stride_cb": 0, "stride_cm": 0, "stride_cn": 0, "stride_bias": 1,
            "stride_ob": size * size, "stride_om": size, "stride_on": 1,
            "alpha": 1, "beta": 0}
    constants = {"HAS_C": False, "HAS_BIAS": bias,
                 "ACTIVATION": k09.ACTIVATION_CODES[activation],
                 "A_3D": batched, "B_3D": batched, "A_TRANS": False, "B_TRANS": b_trans,
                 "UPCAST": False, "EPILOGUE_SUBTILE": cfg.epilogue_subtile,
                 "FLATTEN": cfg.flatten,
                 "BLOCK_SIZE_M": cfg.BLOCK_SIZE_M, "BLOCK_SIZE_N": cfg.BLOCK_SIZE_N,
                 "BLOCK_SIZE_K": cfg.BLOCK_SIZE_K, "GROUP_SIZE_M": cfg.GROUP_SIZE_M,
                 "NUM_SMS": sms}
    return dict(fn=fused_tma_kernel, args=args, constants=constants,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages, cc=cc)


KERNELS = [
    Kernel("k09_fused_tma", 9, "triton", FP16_BF16,
           "k09's fused epilogue on TMA loads and a persistent grouped grid (Hopper); "
           "batched, B row-major or W.t()",
           launch=launch, gemm=gemm_tma, source=fused_tma_kernel, min_cc=(9, 0),
           features=frozenset({"alpha_beta", "bias", "activation", "batched"}),
           in_ladder=False,     # the ladder's TMA rung is k08_triton_tma (same K loop)
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
]
