"""Lesson 08, the fast path on Hopper: TMA tensor descriptors and a persistent grid.

Lesson 07's kernel, autotuned in lesson 08, leaves two Hopper features unused that remove
work from every program; this kernel uses both, with lesson 07's tile (128 x 256 x 64, 8 warps, 3 stages) and grouped order:

* **TMA descriptors.** A host-side ``TensorDescriptor`` describes a whole operand (base,
  shape, strides, the block to copy). ``a_desc.load([row, col])`` becomes one bulk copy
  (``cp.async.bulk.tensor``) of a 128 x 64 tile into shared memory, issued by one thread and
  signalled on a barrier, instead of every thread computing 64 addresses and issuing its own
  cp.async. No address arithmetic, no masks in the kernel: the copy engine fills the part
  of a tile outside the operand with zeros (the K edge, the M and N edges) and the store
  ``c_desc.store`` writes only the part inside C.
* **A persistent grid.** One program per multiprocessor (132 on an H200), each looping over
  tiles in lesson 07's grouped order (``tile_id = pid, pid + NUM_SMS, ...``). Programs are
  launched once, not in waves of 132, and with ``flatten=True`` Triton pipelines across the
  tile boundary: the loads of the next tile's first K-steps overlap the current tile's
  epilogue (the rounding and store of C), which a one-tile program cannot do.

Shared memory: 3 stages x (128 + 256) x 64 x 2 bytes = 144 KB of operand tiles, plus the
128 x 256 fp16 tile of C staged for the TMA store (64 KB): 208 KB of the 227 KB a program
may use, so a 4th stage does not fit.

Narrow outputs: 128 x 256 tiles leave much of the GPU idle where the output has few of
them (6128 x 568: 48 x 3 = 144 tiles, two waves of 132 with the second 9 % full). There the
launcher takes 128 x 128 x 64 tiles (8 warps, 4 stages: 4 x 32 KB + 32 KB of C = 160 KB),
by :func:`gemm_lessons.common.wave_tile`: the larger tile wherever its waves are at least
three-quarters full on average, else the tile whose waves are fuller (240 tiles, 91 %).

Every shape and stride, by the launcher: a descriptor needs the last stride to be 1, the
other strides and the base address to be multiples of 16 bytes. An operand that is not so
(transposed, sliced, a row length that is not a multiple of 8 halves) is first copied into
a buffer whose rows are padded to 16 bytes; the descriptor keeps the true shape, so the
padding is never read. If C's rows are not a multiple of 16 bytes, the kernel writes a
padded buffer that is then copied into C. Aligned row-major operands (the case that is
timed) are used in place, with no copy.

dtypes: fp16 and bf16 (tensor cores only; fp32 stays with lessons 07-08). Needs sm_90 for
TMA on a GPU. Engines: Triton's interpreter runs the same kernel on CPU tensors, with small
tiles and a pretend GPU of 3 multiprocessors, so each program loops over several tiles;
there bf16 operands are widened to fp32 as in lesson 07 (the interpreter's bf16 ``tl.dot``
is wrong).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import engines
from ..common import cdiv, dtype_name, sm_count, wave_tile
from . import FP16_BF16, Kernel
from .k07_triton_swizzle import TileConfig, grouped_pid, operands

__all__ = ["tma_persistent_kernel", "GPU_CONFIG", "NARROW_CONFIG", "config_for", "SIM_CONFIG", "SIM_SMS", "GROUP_SIZE_M",
           "tma_ready", "tma_view", "persistent_programs", "descriptors", "matmul", "asm_job"]


@triton.jit
def tma_persistent_kernel(
        a_desc, b_desc, c_desc,          # TMA descriptors of A (M x K), B (K x N), C (M x N)
        M, N, K,
        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
        GROUP_SIZE_M: tl.constexpr,
        NUM_SMS: tl.constexpr,           # the loop's step; the grid is min(NUM_SMS, tiles)
        INPUT_PRECISION: tl.constexpr,
):
    start_pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    num_tiles = num_pid_m * num_pid_n
    # persistent: this program takes tiles start_pid, start_pid + NUM_SMS, ... in grouped order
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = grouped_pid(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for ki in range(k_tiles):
            # one bulk copy per tile; outside the operand the copy engine fills zeros
            a = a_desc.load([pid_m * BLOCK_SIZE_M, ki * BLOCK_SIZE_K])
            b = b_desc.load([ki * BLOCK_SIZE_K, pid_n * BLOCK_SIZE_N])
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        # round once, after the loop; the store writes only the part of the tile inside C
        c_desc.store([pid_m * BLOCK_SIZE_M, pid_n * BLOCK_SIZE_N], acc.to(c_desc.dtype))


# On a GPU: lesson 07's tile; with the staged C tile, 3 stages fit in shared memory, 4 do not
GPU_CONFIG = TileConfig(128, 256, 64, 8, 3)
NARROW_CONFIG = TileConfig(128, 128, 64, 8, 4)    # where 128 x 256 tiles fill waves poorly
# the interpreter: small tiles, and 3 "multiprocessors" so each program loops over tiles
SIM_CONFIG = TileConfig(16, 16, 16, 1, 1)
SIM_SMS = 3
GROUP_SIZE_M = 8


def tma_ready(t):
    """Whether a TMA descriptor can address the 2-D tensor ``t`` in place: unit last stride,
    rows apart by a multiple of 16 bytes (and not overlapping), a 16-byte-aligned base."""
    size = t.element_size()
    return (t.stride(1) == 1 and t.stride(0) >= t.shape[1] and (t.stride(0) * size) % 16 == 0
            and t.data_ptr() % 16 == 0)


def tma_view(t, *, copy=True):
    """``t`` itself if :func:`tma_ready`, else a view of the same shape into a new buffer whose
    rows are padded to 16 bytes (holding a copy of ``t`` if ``copy``, NaN otherwise)."""
    if tma_ready(t):
        return t
    rows, cols = t.shape
    step = 16 // t.element_size()
    buf = torch.full((rows, cdiv(cols, step) * step), float("nan"), dtype=t.dtype,
                     device=t.device)
    view = buf[:, :cols]
    if copy:
        view.copy_(t)
    return view


def persistent_programs(device=None):
    """Programs of the persistent grid: one per multiprocessor of this GPU
    (:func:`~gemm_lessons.common.sm_count`); on the interpreter :data:`SIM_SMS`, so that on
    small problems each program still loops over several tiles, as on a GPU."""
    return sm_count(device) if engines.on_gpu() else SIM_SMS


def config_for(M, N, sms):
    """The GPU configuration for an M x N output on ``sms`` programs: :data:`GPU_CONFIG`, or
    :data:`NARROW_CONFIG` where its tiles fill the persistent grid's waves better
    (:func:`~gemm_lessons.common.wave_tile`)."""
    configs = (GPU_CONFIG, NARROW_CONFIG)
    tile = wave_tile(M, N, [(c.BM, c.BN) for c in configs], sms)
    return configs[[(c.BM, c.BN) for c in configs].index(tile)]


def descriptors(a, b, out, config):
    """The three TMA descriptors: tiles of BM x BK of A, BK x BN of B, BM x BN of C."""
    return (TensorDescriptor.from_tensor(a, [config.BM, config.BK]),
            TensorDescriptor.from_tensor(b, [config.BK, config.BN]),
            TensorDescriptor.from_tensor(out, [config.BM, config.BN]))


def matmul(a, b, c, *, config=None, sms=None, group_size_m=GROUP_SIZE_M):
    """C = A @ B with :func:`tma_persistent_kernel` on a persistent grid of
    ``min(sms, tiles)`` programs (``sms``: this GPU's multiprocessors by default).

    Operands a descriptor cannot address are copied first (see the module's docstring).
    """
    M, K = a.shape
    N = b.shape[1]
    sms = persistent_programs(c.device) if sms is None else sms
    cfg = config or (config_for(M, N, sms) if engines.on_gpu() else SIM_CONFIG)
    a, b, precision = operands(a, b)          # the interpreter: bf16 widened to fp32
    a, b = tma_view(a), tma_view(b)
    out = tma_view(c, copy=False)
    a_desc, b_desc, c_desc = descriptors(a, b, out, cfg)
    tiles = cdiv(M, cfg.BM) * cdiv(N, cfg.BN)
    tma_persistent_kernel[(min(sms, tiles),)](
        a_desc, b_desc, c_desc, M, N, K,
        BLOCK_SIZE_M=cfg.BM, BLOCK_SIZE_N=cfg.BN, BLOCK_SIZE_K=cfg.BK,
        GROUP_SIZE_M=group_size_m, NUM_SMS=sms, INPUT_PRECISION=precision,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if out is not c:
        c.copy_(out)
    return c


def asm_job(dtype=torch.float16, *, config=None, cc=(9, 0), size=4096, sms=132):
    """The compilation of the GPU configuration for ``cc`` as a launch on contiguous
    ``size``-cubed operands would specialise it (for
    :func:`gemm_lessons.triton_asm.compile_kernels`)."""
    cfg = config or GPU_CONFIG
    name = dtype_name(dtype)
    args = {"a_desc": {"desc": name, "block": [cfg.BM, cfg.BK]},
            "b_desc": {"desc": name, "block": [cfg.BK, cfg.BN]},
            "c_desc": {"desc": name, "block": [cfg.BM, cfg.BN]},
            "M": size, "N": size, "K": size}
    constants = {"BLOCK_SIZE_M": cfg.BM, "BLOCK_SIZE_N": cfg.BN, "BLOCK_SIZE_K": cfg.BK,
                 "GROUP_SIZE_M": GROUP_SIZE_M, "NUM_SMS": sms, "INPUT_PRECISION": "tf32"}
    return dict(fn=tma_persistent_kernel, args=args, constants=constants,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages, cc=cc)


KERNELS = [
    Kernel("k08_triton_tma", 8, "triton", FP16_BF16,
           "Hopper fast path: TMA descriptor loads/stores, persistent grid (one program per SM)",
           launch=matmul, source=tma_persistent_kernel, min_cc=(9, 0),
           configs={"gpu": GPU_CONFIG, "simulator": SIM_CONFIG}),
]
