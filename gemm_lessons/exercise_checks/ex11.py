"""The checks of lesson 11 (FP8 scaled GEMM): ``exercises/11_*.ipynb``.

Every answer is plain torch on the CPU; each check runs it on cases chosen so that each
typical mistake shows (a ragged last block, an all-zero channel, a tie between two FP8
values, a column past the first 128), and names the mistake it sees."""
from __future__ import annotations

import inspect
import math
import re

import numpy as np
import torch

from .guards import ExerciseError, run_answer
from .refusal import no_package_calls

E4M3_MAX = 448.0


def _tensor(out, what, shape=None):
    if not isinstance(out, torch.Tensor):
        raise ExerciseError(f"{what} returned {type(out).__name__}, not a torch.Tensor")
    if shape is not None and tuple(out.shape) != tuple(shape):
        raise ExerciseError(f"{what} returned shape {tuple(out.shape)}; expected {tuple(shape)}")
    return out


# ------------------------------------------------------------------ exercise 1: pow2 scales
def _channels(seed=0):
    g = torch.Generator().manual_seed(seed)
    K, N = 40, 9
    w = torch.randn(K, N, generator=g, dtype=torch.float64)
    w *= torch.logspace(-4, 3, N, dtype=torch.float64)            # channels of every size
    w[:, 3] = 0.0                                                 # a channel pruned to zero
    w[:, 5] = w[:, 5].clamp(-50.0, 50.0)
    w[0, 5] = 56.0                                                # amax / 448 = 2**-3 exactly
    w[0, 6] = -3.0e4                                              # a negative outlier
    return w.float()


def ex11_pow2_scales(pow2_col_scales):
    """Lesson 11, exercise 1: one power-of-two scale per column (output channel) of a
    (K, N) weight, the smallest with max |w[:, n]| / scale <= 448; 1 for an all-zero
    column."""
    w = _channels()
    with run_answer("pow2_col_scales"), no_package_calls("pow2_col_scales"):
        s = pow2_col_scales(w.clone())
    K, N = w.shape
    if isinstance(s, torch.Tensor) and tuple(s.shape) in ((K, 1), (1, K), (K,)) and K != N:
        raise ExerciseError(f"pow2_col_scales returned shape {tuple(s.shape)}: one scale per "
                            f"row of the (K, N) = {tuple(w.shape)} weight; want one per column, "
                            f"shape (1, N) = (1, {N}): the max over dim=0, the K values of a column")
    s = _tensor(s, "pow2_col_scales", (1, N)).double()
    if not torch.isfinite(s).all() or (s <= 0).any():
        bad = [n for n in range(N) if not (math.isfinite(s[0, n].item()) and s[0, n].item() > 0)]
        raise ExerciseError(f"columns {bad} got scale {[s[0, n].item() for n in bad]}: column 3 "
                            "is all zero (max 0, log2(0) = -inf): give such a column the scale "
                            "1, not 0, inf or NaN")
    amax = w.double().abs().amax(dim=0)
    for n in range(N):
        v = s[0, n].item()
        m, e = math.frexp(v)
        if m != 0.5:
            raise ExerciseError(f"column {n}: scale {v:.6g} is not a power of two: round the "
                                "exponent, log2(amax / 448), to an integer (and take 2 to it), "
                                "rather than amax / 448 itself")
        if amax[n] == 0:
            if v != 1.0:
                raise ExerciseError(f"column {n} is all zero: its scale should be 1, got {v:g}")
            continue
        if amax[n] / v > E4M3_MAX:
            raise ExerciseError(
                f"column {n}: max |w| = {amax[n].item():.6g}, scale {v:g}: max / scale = "
                f"{(amax[n] / v).item():.6g} > 448 saturates: round the exponent up "
                "(ceil), not down or to nearest")
        if amax[n] / v <= E4M3_MAX / 2:
            raise ExerciseError(
                f"column {n}: max |w| = {amax[n].item():.6g}, scale {v:g}: max / scale = "
                f"{(amax[n] / v).item():.6g} uses less than half of e4m3's range: the smallest "
                "power of two that keeps max / scale <= 448 is wanted (one too large: an "
                "exponent rounded up once too often, or ceil of a value that is already whole)")
    return f"pow2_col_scales: power-of-two scales, one per column, right on {N} channels"


# ------------------------------------------------------------------ exercise 2: round to e4m3
def _e4m3_cases():
    grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    grid = grid.float()
    grid = grid[torch.isfinite(grid)]
    pos = torch.unique(grid[grid >= 0]).double()
    mids = (pos[1:] + pos[:-1]) / 2                                # ties between neighbours
    g = torch.Generator().manual_seed(11)
    rand = torch.randn(2000, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-12, 10, (2000,), generator=g).double())
    xs = torch.cat([pos, mids, mids * (1 + 2.0 ** -20), mids * (1 - 2.0 ** -20), rand,
                    torch.tensor([449.0, 464.0, 480.0, 1e4, 2.0 ** -10, 3 * 2.0 ** -11])])
    xs = torch.cat([xs, -xs]).float()
    return xs


def _reference_e4m3(x):
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


def ex11_round_e4m3(round_e4m3):
    """Lesson 11, exercise 2: round fp32 values to the nearest e4m3 value (ties to even),
    saturating at +-448, with e4m3's subnormals, without torch's float8 dtypes."""
    try:
        src = inspect.getsource(round_e4m3)
    except (OSError, TypeError):
        src = ""
    if re.search(r"float8|\bfp8\s*\.|import\s+fp8|fp8\s+import", src):
        raise ExerciseError("round_e4m3 uses an FP8 dtype (or the package's fp8 module): the "
                            "exercise is the rounding itself, in fp32 arithmetic")
    xs = _e4m3_cases()
    with run_answer("round_e4m3"), no_package_calls("round_e4m3"):
        got = round_e4m3(xs.clone())
    got = _tensor(got, "round_e4m3", xs.shape).float()
    want = _reference_e4m3(xs)
    wrong = ~((got == want) | (torch.isnan(got) & torch.isnan(want)))
    if not wrong.any():
        with run_answer("round_e4m3"), no_package_calls("round_e4m3"):
            z = round_e4m3(torch.tensor([0.0, -0.0, 1.0]))
        if not torch.equal(z.float(), torch.tensor([0.0, 0.0, 1.0])):
            raise ExerciseError("round_e4m3(0) should be 0 (log2(0) is -inf: keep it finite)")
        return f"round_e4m3: bit-exact against e4m3 on {xs.numel()} values"
    i = int(wrong.nonzero()[0])
    lines = [f"round_e4m3({xs[i].item()!r}) = {got[i].item()!r}, expected {want[i].item()!r} "
             f"({int(wrong.sum())} of {xs.numel()} values wrong)"]
    for cause, kw in _MISTAKES:
        alt = _rounded(xs, **kw)
        if bool(((got == alt) | (torch.isnan(got) & torch.isnan(alt)))[wrong].all()):
            break
    else:
        cause = ("e4m3 has 3 mantissa bits: within [2**e, 2**(e+1)) the values are 2**(e - 3) "
                 "apart, e no lower than -6; round to the nearest (ties to even), clamp to 448")
    lines.append(f"Likely cause: {cause}")
    raise ExerciseError("\n".join(lines))


def _rounded(x, mode="even", saturate=True, subnormals=True, mbits=3, signed=True):
    """What a rounding to e4m3 with one thing changed gives (to name a learner's mistake)."""
    a = x.double().abs()
    if saturate:
        a = a.clamp(max=E4M3_MAX)
    e = torch.floor(torch.log2(a))
    e = e.clamp(min=-6) if subnormals else e          # without: 0 gives 0 / 0 = NaN
    step = torch.exp2(e - mbits)
    v = a / step
    r = {"even": torch.round(v), "away": torch.floor(v + 0.5), "trunc": torch.trunc(v)}[mode]
    r = r * step
    if saturate:
        r = r.clamp(max=E4M3_MAX)
    return (torch.sign(x.double()) * r if signed else r).float()


_MISTAKES = [
    ("rounded toward zero (truncated): round to the nearest value, torch.round of the value "
     "in units of the step", dict(mode="trunc")),
    ("a tie between two e4m3 values goes to the even one (torch.round does; floor(v + 0.5) "
     "rounds ties away from zero)", dict(mode="away")),
    ("beyond 448 e4m3 saturates: clamp the magnitude to 448", dict(saturate=False)),
    ("below 2**-6, e4m3's smallest normal value, the values are subnormal: their step stays "
     "2**-9 (clamp the exponent at -6; that also keeps 0, whose log2 is -inf, finite)",
     dict(subnormals=False)),
    ("the step: e4m3 has 3 mantissa bits, so within [2**e, 2**(e+1)) the values are "
     "2**(e - 3) apart (2 bits is e5m2)", dict(mbits=2)),
    ("the sign: round the magnitude, then give it x's sign", dict(signed=False)),
]


# ------------------------------------------------------------------ exercise 3: promotion
ACC_BITS = 14


def make_mma(bits=ACC_BITS, log=None):
    """The emulated FP8 tensor-core instruction the exercise uses:
    ``mma(part, a_chunk, b_chunk)`` adds ``a_chunk @ b_chunk`` (up to 32 values of K) into
    ``part`` with an accumulator of ``bits`` significant bits (every addend cut at the
    largest exponent's ``bits``-th bit, toward zero). ``log``: a list to which each call
    appends how many products the accumulator then holds since it was last zero."""
    state = {"since": 0}

    def mma(part, a_chunk, b_chunk):
        part = torch.as_tensor(part, dtype=torch.float64)
        a = np.asarray(torch.as_tensor(a_chunk).double())
        b = np.asarray(torch.as_tensor(b_chunk).double())
        if a.shape[1] > 32 or a.shape[1] != b.shape[0]:
            raise ExerciseError(f"mma takes a chunk of at most 32 values of K from A and the "
                                f"same from B; got {a.shape} and {b.shape}")
        if not bool((part == 0).all()):
            state["since"] += a.shape[1]
        else:
            state["since"] = a.shape[1]
        if log is not None:
            log.append(state["since"])
        terms = a[:, None, :] * b.T[None, :, :]
        allt = np.concatenate([np.asarray(part)[..., None], terms], axis=-1)
        top = np.abs(allt).max(axis=-1)
        _, e = np.frexp(top)
        quantum = np.ldexp(1.0, np.where(top == 0, -1000, e - bits))[..., None]
        kept = np.trunc(allt / quantum) * quantum
        return torch.from_numpy(kept.sum(axis=-1).astype(np.float32).astype(np.float64))
    return mma


def _block_case(M, N, K, seed):
    g = torch.Generator().manual_seed(seed)
    kb, nb = -(-K // 128), -(-N // 128)
    qa = (torch.randn(M, K, generator=g) * 40).clamp(-448, 448).to(torch.float8_e4m3fn).double()
    qb = (torch.randn(K, N, generator=g).abs() * 40).clamp(-448, 448).to(torch.float8_e4m3fn).double()
    qa = qa.abs()                                     # positive: sums grow with K
    sa = torch.exp2(torch.randint(-3, 4, (M, kb), generator=g).double()) * (1 + torch.rand(M, kb, generator=g, dtype=torch.float64))
    sb = torch.exp2(torch.randint(-3, 4, (kb, nb), generator=g).double()) * (1 + torch.rand(kb, nb, generator=g, dtype=torch.float64))
    sa, sb = sa.float().double(), sb.float().double()
    return qa, sa, qb, sb


def _dequant_ref(qa, sa, qb, sb):
    K = qa.shape[1]
    N = qb.shape[1]
    k_blk = torch.arange(K) // 128
    n_blk = torch.arange(N) // 128
    A = qa * sa[:, k_blk]
    B = qb * sb[k_blk][:, n_blk]
    return A @ B


def ex11_promotion(blockscaled_dot):
    """Lesson 11, exercise 3: a block-scaled K loop on an emulated FP8 tensor core: each
    128-wide K block accumulated from zero by ``mma`` (4 chunks of 32), then scaled by its
    blocks' scales and promoted into an fp32 accumulator."""
    cases = [(6, 200, 300, 1), (3, 20, 64, 2), (4, 130, 520, 3)]
    for M, N, K, seed in cases:
        qa, sa, qb, sb = _block_case(M, N, K, seed)
        log = []
        mma = make_mma(log=log)
        with run_answer("blockscaled_dot"), no_package_calls("blockscaled_dot", allowed=(mma,)):
            got = blockscaled_dot(qa.clone(), sa.clone(), qb.clone(), sb.clone(), mma)
        got = _tensor(got, "blockscaled_dot", (M, N)).double()
        where = f"M={M}, N={N}, K={K}"
        if not log:
            raise ExerciseError(f"{where}: mma was never called: compute the products with the "
                                "tensor core's instruction, mma(part, a_chunk, b_chunk)")
        ref = _dequant_ref(qa, sa, qb, sb)
        if max(log) > 128:
            raise ExerciseError(
                f"{where}: the tensor core's accumulator held {max(log)} products before it "
                "was emptied: the partial sum was never promoted (pass a zero partial to mma "
                "at the start of every 128-wide K block, after adding the last one, scaled, "
                "into the fp32 accumulator)")
        if sum(1 for _ in log) < -(-K // 32):
            raise ExerciseError(f"{where}: mma ran {len(log)} times for ceil(K / 32) = "
                                f"{-(-K // 32)} chunks: the last, partial K block (K % 128 = "
                                f"{K % 128}) is dropped; loop over ceil(K / 128) blocks")
        rel = ((got - ref).norm() / ref.norm()).item()
        if not rel < 1e-3:
            cause = _promotion_cause(got, qa, sa, qb, sb, K, N)
            raise ExerciseError(f"{where}: relative error {rel:.2e} against float64 of the "
                                f"dequantized operands. Likely cause: {cause}")
    return ("blockscaled_dot: each 128-wide K block from zero, scaled, promoted to fp32: "
            f"right on {len(cases)} shapes")


def _promotion_cause(got, qa, sa, qb, sb, K, N):
    n_blk = torch.arange(N) // 128
    kb = -(-K // 128)
    parts = [qa[:, j * 128:(j + 1) * 128] @ qb[j * 128:(j + 1) * 128] for j in range(kb)]
    variants = {
        "B's scale: a column n uses sb[kb, n // 128] (its 128-wide block of columns), not "
        "sb[kb, n % ...] or one scale for the whole row of blocks":
            sum(p * sa[:, j:j + 1] * sb[j, 0] for j, p in enumerate(parts)),
        "the scales are applied once, with the first block's, after the K loop: each K "
        "block's partial takes its own scales, before it joins the accumulator":
            sum(parts) * sa[:, :1] * sb[0, n_blk][None, :],
        "A's scale: row m's scale for K block j is sa[m, j]":
            sum(p * sa[:, :1] * sb[j, n_blk][None, :] for j, p in enumerate(parts)),
    }
    for cause, alt in variants.items():
        if ((got - alt).norm() / alt.norm()).item() < 1e-2:
            return cause
    return ("each K block's partial, from zero, times sa[:, j] (per row) and sb[j, n // 128] "
            "(per column), added into the fp32 accumulator")


# ------------------------------------------------------------------ exercise 4: the scale's index
def ex11_scale_offsets(scale_offsets):
    """Lesson 11, exercise 4: the flat offset, in a row-major buffer of block scales, of the
    scale of element (i, j) of a (rows, cols) matrix cut into (br, bc) blocks."""
    cases = [((300, 260), (128, 128)), ((5, 300), (1, 128)), ((200, 129), (128, 128)),
             ((70, 90), (32, 64)), ((1, 1), (128, 128))]
    for (rows, cols), (br, bc) in cases:
        i = torch.arange(rows).repeat_interleave(cols)
        j = torch.arange(cols).repeat(rows)
        with run_answer("scale_offsets"), no_package_calls("scale_offsets"):
            got = scale_offsets(i.clone(), j.clone(), rows, cols, br, bc)
        got = _tensor(got, "scale_offsets", i.shape).long()
        per_row = -(-cols // bc)
        want = (i // br) * per_row + j // bc
        bad = (got != want).nonzero()
        if len(bad):
            k = int(bad[0])
            ii, jj = int(i[k]), int(j[k])
            g, w = int(got[k]), int(want[k])
            where = (f"({rows} x {cols} matrix, {br} x {bc} blocks): element ({ii}, {jj}) "
                     f"got offset {g}, expected {w} (block row {ii // br}, block column "
                     f"{jj // bc}, {per_row} blocks per row)")
            if g == (ii // br) * (cols // bc) + jj // bc:
                cause = (f"the blocks per row: a ragged last block counts, so a row holds "
                         f"ceil(cols / bc) = {per_row} scales, not cols // bc = {cols // bc}")
            elif g == (jj // bc) * (-(-rows // br)) + ii // br:
                cause = "the buffer is row-major over the blocks: offset = block_row * blocks_per_row + block_col"
            elif g == (ii // bc) * per_row + jj // br:
                cause = "rows are cut by br and columns by bc: the two block sizes swapped"
            elif g == (ii % br) * per_row + jj % bc or g == (ii // br) * per_row + jj % bc \
                    or g == (ii % br) * per_row + jj // bc:
                cause = "the block of an index is i // br (which block), not i % br (where in the block)"
            else:
                cause = "offset = (i // br) * ceil(cols / bc) + j // bc"
            raise ExerciseError(f"scale_offsets {where}. Likely cause: {cause}")
    return f"scale_offsets: every element's block scale found on {len(cases)} layouts"
