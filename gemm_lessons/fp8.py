"""FP8 on the CPU: the two formats, scales, quantization, data like a trained layer's, and an
emulation of the FP8 tensor core's accumulator (lesson 11).

* **Formats.** ``torch.float8_e4m3fn`` (4 exponent bits, 3 mantissa bits, largest 448, no
  infinity) and ``torch.float8_e5m2`` (5 and 2, largest 57344, with infinity) exist as torch
  dtypes on the CPU; :func:`round_to` rounds through them, after clamping to the format's
  range, so that every value saturates the same way on every torch version and device.
  :func:`values` lists every finite value a format holds; :data:`FORMATS` its constants.
* **Scales.** An FP8 tensor is stored as ``q = round(x / s)`` with ``s`` chosen so that the
  largest magnitude in the group lands on the format's largest value: one ``s`` per tensor,
  per row, per column, or per block (1 x 128 for activations, 128 x 128 for weights, as in
  DeepSeek-V3's training). :func:`quantize` returns ``(q, s)`` with ``s`` shaped as the
  kernels of lesson 11 and ``torch._scaled_mm`` take it; :func:`dequantize` undoes it.
* **Data.** :func:`activations` and :func:`weights`: seeded matrices whose statistics look
  like a trained transformer layer's (heavy tails, channels of very different size, a few
  outlier channels), the data on which the choice of scale granularity matters.
* **The accumulator.** Hopper's FP8 tensor-core instructions (``wgmma ... .e4m3``) add their
  products into an accumulator that keeps fewer bits than fp32. DeepSeek-V3's technical
  report (arXiv:2412.19437, section 3.3.2) measured that it keeps about 14 bits: the products
  are aligned to the largest exponent and only the top 14 bits of each are added.
  SageAttention2 (arXiv:2411.10958) found the same width from the other side (1 sign, 8
  exponent and 13 stored mantissa bits: 14 significant bits). NVIDIA does not document it.
  :func:`limited_sum` is a model of that accumulator (an emulation, not the hardware), and
  :func:`emulated_dot` the K loop around it: with ``promote_every=None`` the whole K loop
  stays in the limited accumulator; with ``promote_every=128`` every 128 products the
  partial sum is added into a true fp32 accumulator and the limited one restarts from zero,
  which is what CUTLASS, DeepGEMM and Triton's ``max_num_imprecise_acc`` do.

Imports neither numba nor triton.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["FORMATS", "Fp8Format", "SCALE_BLOCK", "fmt", "round_to", "values", "amax_scale", "quantize",
           "dequantize", "expand_scales", "activations", "weights", "rel_error",
           "ACC_BITS", "K_PER_INSTRUCTION", "limited_sum", "emulated_dot"]


@dataclass(frozen=True)
class Fp8Format:
    """One FP8 format: its torch dtype, bit fields and range."""
    name: str
    dtype: torch.dtype
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float              # the largest finite value
    min_normal: float       # the smallest normal value: 2 ** (1 - bias)
    min_subnormal: float    # the smallest positive value: min_normal * 2 ** -mantissa_bits

    @property
    def relative_step(self):
        """The gap between 1 and the next value: the relative rounding step of a normal value
        is at most half of it."""
        return 2.0 ** -self.mantissa_bits


FORMATS = {
    "e4m3": Fp8Format("e4m3", torch.float8_e4m3fn, 4, 3, 7, 448.0, 2.0 ** -6, 2.0 ** -9),
    "e5m2": Fp8Format("e5m2", torch.float8_e5m2, 5, 2, 15, 57344.0, 2.0 ** -14, 2.0 ** -16),
}
_BY_DTYPE = {f.dtype: f for f in FORMATS.values()}
SCALE_BLOCK = 128     # block scales: 1 x 128 of activations, 128 x 128 of weights (DeepSeek-V3)


def fmt(which) -> Fp8Format:
    """The :class:`Fp8Format` of ``"e4m3"``, ``"e5m2"`` or their torch dtype."""
    if isinstance(which, Fp8Format):
        return which
    if isinstance(which, torch.dtype) and which in _BY_DTYPE:
        return _BY_DTYPE[which]
    if isinstance(which, str) and which in FORMATS:
        return FORMATS[which]
    raise ValueError(f"unknown FP8 format {which!r}: use 'e4m3' (torch.float8_e4m3fn) or "
                     "'e5m2' (torch.float8_e5m2)")


def round_to(x, which="e4m3"):
    """``x`` rounded to the nearest value of the format (ties to even), as float32; beyond
    the largest value it saturates to +-max; NaN stays NaN."""
    f = fmt(which)
    x = torch.as_tensor(x, dtype=torch.float32)
    return x.clamp(-f.max, f.max).to(f.dtype).to(torch.float32)


def values(which="e4m3"):
    """Every finite value of the format, sorted (a float64 tensor): all 256 bit patterns
    read as the format, NaN and infinities left out."""
    f = fmt(which)
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(f.dtype).double()
    return torch.unique(every[torch.isfinite(every)])


# ------------------------------------------------------------------ scales
def _check_float(x, what="x"):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{what} must be 2-D; got shape {tuple(x.shape)}")
    if not x.dtype.is_floating_point or x.dtype in _BY_DTYPE:
        raise TypeError(f"{what} must hold fp32/fp16/bf16/fp64 values to quantize, not "
                        f"{x.dtype}")


def _granularity(granularity, shape):
    """(block rows, block cols) of a granularity name or a (rows, cols) pair."""
    rows, cols = shape
    named = {"tensor": (rows, cols), "row": (1, cols), "col": (rows, 1)}
    if isinstance(granularity, str):
        if granularity not in named:
            raise ValueError(f"unknown granularity {granularity!r}: use 'tensor', 'row', "
                             "'col' or a block (rows, cols) such as (1, 128) or (128, 128)")
        return named[granularity]
    try:
        br, bc = (int(v) for v in granularity)
    except (TypeError, ValueError):
        raise ValueError(f"granularity {granularity!r}: want a name or a (rows, cols) "
                         "block") from None
    if br < 1 or bc < 1:
        raise ValueError(f"block {granularity!r}: sizes must be >= 1")
    return br, bc


def amax_scale(amax, which="e4m3"):
    """The scale that maps a group's largest magnitude ``amax`` onto the format's largest
    value: ``amax / max`` (1 where a group is all zero, so that nothing divides by 0)."""
    f = fmt(which)
    amax = torch.as_tensor(amax, dtype=torch.float32)
    return torch.where(amax > 0, amax / f.max, torch.ones_like(amax))


def _block_amax(x, br, bc):
    """The largest magnitude of every br x bc block of ``x`` (blocks at the edges ragged)."""
    rows, cols = x.shape
    nr, nc = -(-rows // br), -(-cols // bc)
    padded = x.new_zeros(nr * br, nc * bc)
    padded[:rows, :cols] = x.abs()
    return padded.view(nr, br, nc, bc).amax(dim=(1, 3))


def expand_scales(scale, shape, block):
    """A full (rows, cols) tensor holding, for every element, the scale of its block."""
    rows, cols = shape
    br, bc = block
    return scale.repeat_interleave(br, dim=0).repeat_interleave(bc, dim=1)[:rows, :cols]


def quantize(x, granularity="tensor", which="e4m3"):
    """``(q, scale)``: ``x`` (2-D) stored in FP8 with one scale per group, ``x ~ q * scale``.

    ``granularity``: ``"tensor"`` (one scale: shape ()), ``"row"`` (one per row: (rows, 1)),
    ``"col"`` (one per column: (1, cols)) or a block ``(br, bc)`` (shape
    (ceil(rows / br), ceil(cols / bc)); ``(1, 128)`` for activations, ``(128, 128)`` for
    weights). Scales are float32; ``q`` has the format's torch dtype.
    """
    _check_float(x)
    f = fmt(which)
    x = x.float()
    br, bc = _granularity(granularity, x.shape)
    amax = _block_amax(x, br, bc)
    scale = amax_scale(amax, f)
    if granularity == "tensor":
        scale = scale.reshape(())
    full = expand_scales(scale.reshape(amax.shape), x.shape, (br, bc))
    q = (x / full).clamp(-f.max, f.max).to(f.dtype)
    return q, scale


def dequantize(q, scale, block=None):
    """``q * scale`` in float32. ``scale`` of shape (), (rows, 1) or (1, cols) broadcasts;
    a block scale needs ``block`` (its (rows, cols))."""
    qf = q.float()
    if block is None:
        return qf * scale
    return qf * expand_scales(scale, q.shape, block)


# ------------------------------------------------------------------ data like a trained layer's
def activations(rows, cols, *, seed=0, outlier_channels=4, outlier_size=100.0,
                dtype=torch.float32):
    """Seeded (rows, cols) activations, like the input of a transformer's linear layer:
    heavy-tailed values (Student's t, 4 degrees of freedom), channels (columns) whose sizes
    spread over a decade, and ``outlier_channels`` channels about ``outlier_size`` times
    larger than the rest (the "outlier features" of large language models)."""
    g = np.random.default_rng(seed)
    x = g.standard_t(4, size=(rows, cols))
    x *= np.exp(g.normal(0.0, 0.6, size=(1, cols)))            # channels of different size
    if outlier_channels:
        which = g.choice(cols, size=min(outlier_channels, cols), replace=False)
        x[:, which] *= outlier_size
    return torch.from_numpy(x).to(dtype)


def weights(rows, cols, *, seed=1, dtype=torch.float32):
    """Seeded (rows, cols) = (K, N) weights of a linear layer: about N(0, 1/K) with heavy
    tails (Student's t, 6 degrees of freedom) and output channels (columns) whose sizes
    differ by a factor of a few."""
    g = np.random.default_rng(seed)
    w = g.standard_t(6, size=(rows, cols)) / math.sqrt(rows)
    w *= np.exp(g.normal(0.0, 0.4, size=(1, cols)))
    return torch.from_numpy(w).to(dtype)


def rel_error(x, ref):
    """``||x - ref|| / ||ref||`` in float64 (Frobenius norms)."""
    x, ref = torch.as_tensor(x).double(), torch.as_tensor(ref).double()
    den = ref.norm().item()
    return (x - ref).norm().item() / (den if den > 0 else 1.0)


# ------------------------------------------------------------------ the FP8 accumulator
ACC_BITS = 14             # significant bits the FP8 tensor core keeps (DeepSeek-V3, 3.3.2)
K_PER_INSTRUCTION = 32    # products per row and column in one FP8 wgmma (m64nNk32)


def _lead_exponent(v):
    """floor(log2(|v|)) elementwise (float64 arrays); a very small number for 0."""
    mant, exp = np.frexp(v)            # v = mant * 2**exp with 0.5 <= |mant| < 1
    return np.where(v == 0, -10_000, exp - 1)


def limited_sum(acc, terms, bits=ACC_BITS):
    """One FP8 tensor-core instruction as modelled here: ``acc + terms.sum(-1)`` where every
    addend (the accumulator and each product) is first aligned to the largest exponent among
    them and cut to the ``bits`` leading bits of that exponent (truncated toward zero).

    ``acc``: float64 array (...); ``terms``: float64 array (..., k) of exact products.
    Returns a float64 array (...), a value an fp32 register can hold. An emulation from the
    measured behaviour (see the module's docstring), not NVIDIA's specification."""
    allterms = np.concatenate([acc[..., None], terms], axis=-1)
    top = _lead_exponent(np.abs(allterms).max(axis=-1))          # (...)
    quantum = np.ldexp(1.0, top - (bits - 1))[..., None]          # the last bit kept
    kept = np.trunc(allterms / quantum) * quantum
    return kept.sum(axis=-1).astype(np.float32).astype(np.float64)


def emulated_dot(a, b, *, promote_every=None, bits=ACC_BITS, k_step=K_PER_INSTRUCTION):
    """``a @ b`` (float64 results) as an FP8 tensor core accumulates it: K is consumed
    ``k_step`` products at a time (one instruction), each added by :func:`limited_sum`.

    ``promote_every``: None keeps the whole K loop in the limited accumulator (Triton's
    default for an FP8 ``tl.dot`` on Hopper, cuBLAS's "fast accumulation"); a multiple of
    ``k_step`` (128: every 4 instructions) adds the partial sum into an fp32 accumulator and
    restarts the limited one from zero after that many products, and once more at the end.
    ``a`` (M, K), ``b`` (K, N): tensors or arrays of the FP8 values (their products are
    exact in float64)."""
    A = np.asarray(torch.as_tensor(a).double())
    B = np.asarray(torch.as_tensor(b).double())
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise ValueError(f"want a (M, K) and b (K, N); got {A.shape} and {B.shape}")
    if promote_every is not None and (promote_every < k_step or promote_every % k_step):
        raise ValueError(f"promote_every={promote_every}: a multiple of {k_step} (the K of "
                         "one instruction), or None for no promotion")
    M, K = A.shape
    N = B.shape[1]
    total = np.zeros((M, N), dtype=np.float32)     # the fp32 accumulator (CUDA cores)
    part = np.zeros((M, N))                        # the tensor core's accumulator
    since = 0
    for k0 in range(0, K, k_step):
        prods = A[:, None, k0:k0 + k_step] * B[k0:k0 + k_step, :].T[None, :, :]
        part = limited_sum(part, prods, bits)
        since += prods.shape[-1]
        if promote_every is not None and since >= promote_every:
            total = (total + part.astype(np.float32)).astype(np.float32)
            part[:] = 0.0
            since = 0
    total = (total + part.astype(np.float32)).astype(np.float32)
    return torch.from_numpy(total.astype(np.float64))
