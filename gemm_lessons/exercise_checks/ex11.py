"""The checks of lesson 11 (FP8 scaled GEMM): ``exercises/11_*.ipynb``.

Every answer is plain torch on the CPU; each check runs it on cases chosen so that each
typical mistake shows (a ragged last block, an all-zero channel, a tie between two FP8
values, a column past the first 128), and names the mistake it sees."""
from __future__ import annotations

import contextlib
import inspect
import math
import re

import numpy as np
import torch

from .guards import ExerciseError, learner_line, run_answer, shorten
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


def _fits_largest_value(w, s):
    """The scales ``s`` are, on every column whose largest value is positive, the smallest
    power of two that keeps that value (not the largest magnitude) within 448, and that
    differs from the right scale on some column: the abs left out."""
    top = w.double().amax(dim=0)
    amax = w.double().abs().amax(dim=0)
    told = [(s[n].item(), 2.0 ** math.ceil(math.log2(top[n].item() / E4M3_MAX)),
             2.0 ** math.ceil(math.log2(amax[n].item() / E4M3_MAX)))
            for n in range(w.shape[1]) if top[n] > 0]
    return all(v == t for v, t, _ in told) and any(t != r for _, t, r in told)


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
    _pow2_cause(amax, s[0])
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
        if amax[n] / v > E4M3_MAX and _fits_largest_value(w, s[0]):
            top = w.double()[:, n].max().item()
            raise ExerciseError(
                f"column {n}: max |w| = {amax[n].item():.6g}, scale {v:g}: max / scale = "
                f"{(amax[n] / v).item():.6g} > 448 saturates; the scale fits the column's "
                f"largest value, {top:.6g}, not its largest magnitude: a negative weight "
                "counts too (amax of w.abs())")
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


_OTHER_MAXIMA = (
    (57344.0, "57344 is e5m2's largest value: the weights are e4m3, whose largest is 448"),
    (240.0, "240 is the largest value of the IEEE-style e4m3 (with infinities, and of "
            "float8_e4m3fnuz); torch.float8_e4m3fn, Hopper's e4m3, reaches 448"),
    (1.0, "the scale maps a column's max onto 1: divide amax by 448 first, so that it maps "
          "onto e4m3's largest value, 448"),
)


def _pow2_cause(amax, s):
    """A mistake that shows on every non-zero column at once: the scales of another format's
    largest value (each column's max / scale in (T / 2, T] for a T other than 448), or
    scales the wrong way round (448 / amax)."""
    nz = amax > 0
    if not bool(nz.any()) or not bool((s[nz] > 0).all()):
        return
    ratio = amax[nz] / s[nz]
    good = (ratio <= E4M3_MAX) & (ratio > E4M3_MAX / 2)
    if bool(good.all()):
        return
    for top, why in _OTHER_MAXIMA:
        if bool(((ratio <= top) & (ratio > top / 2)).all()):
            raise ExerciseError(f"every column's max |w| / scale lies in ({top / 2:g}, {top:g}], "
                                f"not in (224, 448]: {why}")
    inverse = amax[nz] * s[nz] / E4M3_MAX
    if bool(((inverse >= 1) & (inverse < 2)).all()) or bool(((inverse > 0.5) & (inverse <= 1)).all()):
        raise ExerciseError("the scales go the wrong way: they grow as a column's max shrinks "
                            "(about 448 / amax). x = q * scale and q = x / scale, so the scale "
                            "is about amax / 448: a large column needs a large scale")


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


FP8_DTYPES = tuple(d for d in (getattr(torch, n, None) for n in (
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"))
    if d is not None)


class _NoFp8(torch.overrides.TorchFunctionMode):
    """Refuses, while the answer runs, any torch call that takes an FP8 dtype or makes an FP8
    tensor: a cast written in a helper, outside ``round_e4m3``'s own source, counts too."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(a in FP8_DTYPES for a in list(args) + list(kwargs.values())
               if isinstance(a, torch.dtype)):
            raise ExerciseError(_FP8_USED)
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.dtype in FP8_DTYPES:
            raise ExerciseError(_FP8_USED)
        return out


_FP8_USED = ("round_e4m3 uses an FP8 dtype (or the package's fp8 module): the exercise is the "
             "rounding itself, in fp32 arithmetic")


def _run_round(round_e4m3, x):
    mode = _NoFp8()
    with run_answer("round_e4m3"), no_package_calls(
            "round_e4m3", allowed=(mode.__torch_function__,)), mode:
        return round_e4m3(x)


def ex11_round_e4m3(round_e4m3):
    """Lesson 11, exercise 2: round fp32 values to the nearest e4m3 value (ties to even),
    saturating at +-448, with e4m3's subnormals, without torch's float8 dtypes."""
    try:
        src = inspect.getsource(round_e4m3)
    except (OSError, TypeError):
        src = ""
    if re.search(r"float8|\bfp8\s*\.|import\s+fp8|fp8\s+import", src):
        raise ExerciseError(_FP8_USED)
    xs = _e4m3_cases()
    got = _run_round(round_e4m3, xs.clone())
    got = _tensor(got, "round_e4m3", xs.shape).float()
    want = _reference_e4m3(xs)
    wrong = ~((got == want) | (torch.isnan(got) & torch.isnan(want)))
    if not wrong.any():
        z = _run_round(round_e4m3, torch.tensor([0.0, -0.0, 1.0]))
        if not torch.equal(z.float(), torch.tensor([0.0, 0.0, 1.0])):
            raise ExerciseError("round_e4m3(0) should be 0 (log2(0) is -inf: keep it finite)")
        return f"round_e4m3: bit-exact against e4m3 on {xs.numel()} values"
    i = int(wrong.nonzero()[0])
    lines = [f"round_e4m3({xs[i].item()!r}) = {got[i].item()!r}, expected {want[i].item()!r} "
             f"({int(wrong.sum())} of {xs.numel()} values wrong)"]
    lines.append(f"Likely cause: {_rounding_cause(xs, got, want, wrong)}")
    raise ExerciseError("\n".join(lines))


def _on_grid(v, mbits):
    """Whether each |v| (finite, normal range) has at most ``mbits`` mantissa bits."""
    mant, _ = torch.frexp(v.double().abs())
    scaled = mant * 2.0 ** (mbits + 1)
    return scaled == torch.round(scaled)


def _rounding_cause(xs, got, want, wrong):
    """The likely mistake, read from where the wrong values are and what they are (no
    rounding of its own: the reference is torch's cast)."""
    x, g, w = xs.double(), got.double(), want.double()
    a = x.abs()
    X, G, W, A = x[wrong], g[wrong], w[wrong], a[wrong]
    if bool(torch.isnan(G).any()):
        nan = torch.isnan(G)
        if bool((X[nan] < 0).all()):
            return ("the sign: log2 of a negative value is NaN: take the exponent of the "
                    "magnitude |x|, round the magnitude, then give it x's sign")
        if bool((A[nan] < 2.0 ** -6).all()):
            return ("below 2**-6, e4m3's smallest normal value, the values are subnormal: "
                    "their step stays 2**-9 (clamp the exponent at -6; that also keeps 0, "
                    "whose log2 is -inf, finite)")
    if bool((X < 0).all()) and bool((G.abs() == W.abs()).all()):
        return "the sign: round the magnitude, then give it x's sign"
    if bool((A > E4M3_MAX).all()):
        return ("beyond 448 e4m3 saturates: clamp the magnitude to 448 (57344 is e5m2's "
                "largest value)")
    if bool((A > 240).all()) and bool((G.abs() == 240).any()):
        return ("the largest value: torch.float8_e4m3fn, Hopper's e4m3, reaches 448 (240 is "
                "the IEEE-style e4m3's, which keeps infinities); clamp the magnitude to 448")
    if bool((A < 2.0 ** -6).all()):
        return ("below 2**-6, e4m3's smallest normal value, the values are subnormal: their "
                "step stays 2**-9 (clamp the exponent at -6, not lower; that also keeps 0, "
                "whose log2 is -inf, finite)")
    if bool((G.abs() <= A).all()) and bool((G.abs() < W.abs()).all()):
        return ("rounded toward zero (truncated): round to the nearest value, torch.round of "
                "the value in units of the step")
    ties = _ties(A)
    if bool(ties.all()):
        if bool((G.abs() > W.abs()).all()):
            return ("a tie between two e4m3 values goes to the even one (torch.round does; "
                    "floor(v + 0.5) rounds ties away from zero)")
        return "a tie between two e4m3 values goes to the one with an even mantissa"
    normal = (A >= 2.0 ** -6) & (A <= E4M3_MAX)
    if bool(normal.any()):
        Gn = G[normal]
        if bool(_on_grid(Gn, 2).all()):
            return ("the step: e4m3 has 3 mantissa bits, so within [2**e, 2**(e+1)) the values "
                    "are 2**(e - 3) apart (2 bits is e5m2); or the exponent is one too large "
                    "(torch.frexp's exponent is floor(log2(a)) + 1)")
        if not bool(_on_grid(Gn, 3).all()):
            return ("values e4m3 cannot hold: the step is too fine. e4m3 has 3 mantissa bits: "
                    "within [2**e, 2**(e+1)) the values are 2**(e - 3) apart")
    return ("e4m3 has 3 mantissa bits: within [2**e, 2**(e+1)) the values are 2**(e - 3) "
            "apart, e no lower than -6; round to the nearest (ties to even), clamp to 448")


def _ties(a):
    """Whether each magnitude lies exactly halfway between two neighbouring e4m3 values."""
    grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    grid = grid.double()
    pos = torch.unique(grid[torch.isfinite(grid) & (grid >= 0)])
    mids = (pos[1:] + pos[:-1]) / 2
    return torch.isin(a, mids)


# ------------------------------------------------------------------ exercise 3: promotion
ACC_BITS = 14


def _is_e4m3(t):
    t = t.float()
    return bool(((t.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() == t)
                 | torch.isnan(t)).all())


def make_mma(bits=ACC_BITS, log=None, gain=1.0, sizes=None):
    """The emulated FP8 tensor-core instruction the exercise uses:
    ``mma(part, a_chunk, b_chunk)`` adds ``a_chunk @ b_chunk`` (up to 32 values of K, FP8
    values only: it refuses others) into ``part`` with an accumulator of ``bits``
    significant bits (every addend cut at the largest exponent's ``bits``-th bit, toward
    zero). ``log``: a list to which each call appends how many products the accumulator then
    holds since it was last zero; ``sizes``: one to which it appends each chunk's K.
    ``gain``: the products are multiplied by it (a power of two, exact: the check's probe
    that an answer's result comes from mma)."""
    state = {"since": 0}

    def mma(part, a_chunk, b_chunk):
        part = torch.as_tensor(part, dtype=torch.float64)
        a_t, b_t = torch.as_tensor(a_chunk), torch.as_tensor(b_chunk)
        if a_t.dim() != 2 or b_t.dim() != 2 or a_t.shape[1] > 32 or a_t.shape[1] != b_t.shape[0]:
            raise ExerciseError(f"mma takes a chunk of at most 32 values of K from A and the "
                                f"same from B; got {tuple(a_t.shape)} and {tuple(b_t.shape)}")
        for name, t in (("a_chunk", a_t), ("b_chunk", b_t)):
            if not _is_e4m3(t):
                bad = t.flatten()[0].item()
                for v in t.flatten().tolist():
                    if not _is_e4m3(torch.tensor([v])):
                        bad = v
                        break
                raise ExerciseError(
                    f"mma's {name} holds {bad:.6g}, which is no e4m3 value: the tensor core "
                    "multiplies FP8 values only. Give it qa and qb as they are, and apply the "
                    "scales to the partial sum it returns (part * sa[:, j:j + 1] * sb[j, ...]), "
                    "not to the operands")
        a = np.asarray(a_t.double()) * gain
        b = np.asarray(b_t.double())
        if not bool((part == 0).all()):
            state["since"] += a.shape[1]
        else:
            state["since"] = a.shape[1]
        if log is not None:
            log.append(state["since"])
        if sizes is not None:
            sizes.append(a.shape[1])
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


def _dequant_ref(qa, sa, qb, sb_cols):
    """float64 product of the dequantized operands: A's element (m, k) times sa[m, k // 128],
    B's (k, n) times ``sb_cols[k // 128, n]`` (B's scales spread to one per column)."""
    k_blk = torch.arange(qa.shape[1]) // 128
    return (qa * sa[:, k_blk]) @ (qb * sb_cols[k_blk])


def _per_column(sb, N):
    return sb[:, torch.arange(N) // 128]


@contextlib.contextmanager
def _scale_errors(where):
    """Index and broadcast errors of the answer, named in the exercise's terms."""
    try:
        yield
    except ExerciseError:
        raise
    except Exception as e:                                  # noqa: BLE001
        text = f"{type(e).__name__}: {e}"
        line = learner_line(e)
        at = f" at `{line}`" if line else ""
        if "must match the size of tensor" in text and re.search(r"tensor \w \(0\)", text):
            raise ExerciseError(
                f"{where}: an empty slice{at} ({shorten(text, 160)}): a K block's scales past "
                "the end of sa or sb: they hold ceil(K / 128) blocks along K, one per 128 "
                "values: block j = k // 128 (not k // 32, not j + 1)") from None
        if "must match the size of tensor" in text:
            raise ExerciseError(
                f"{where}: shapes that do not broadcast{at} ({shorten(text, 160)}): sa[:, j] "
                "is a vector of M scales, and a vector broadcasts along the last axis, N: A's "
                "scale is per row, so keep it a column, sa[:, j:j + 1] (M, 1); B's, "
                "sb[j, n // 128], is per column (1, N)") from None
        if isinstance(e, IndexError) or "IndexError" in text:
            raise ExerciseError(
                f"{where}: an index past the end of the scales{at} ({shorten(text, 160)}): sa "
                "is (M, ceil(K / 128)) and sb is (ceil(K / 128), ceil(N / 128)): the K block "
                "comes first in sb, sb[j, n // 128], and block j = k // 128") from None
        raise


def ex11_promotion(blockscaled_dot):
    """Lesson 11, exercise 3: a block-scaled K loop on an emulated FP8 tensor core: each
    128-wide K block accumulated from zero by ``mma`` (4 chunks of 32), then scaled by its
    blocks' scales and promoted into an fp32 accumulator."""
    cases = [(6, 200, 300, 1), (3, 20, 64, 2), (4, 130, 520, 3), (9, 9, 260, 4)]
    for M, N, K, seed in cases:
        qa, sa, qb, sb = _block_case(M, N, K, seed)
        where = f"M={M}, N={N}, K={K}"
        log, sizes = [], []
        mma = make_mma(log=log, sizes=sizes)
        with run_answer("blockscaled_dot"), no_package_calls("blockscaled_dot", allowed=(mma,)), \
                _scale_errors(where):
            got = blockscaled_dot(qa.clone(), sa.clone(), qb.clone(), sb.clone(), mma)
        got = _tensor(got, "blockscaled_dot", (M, N)).double()
        if not log:
            raise ExerciseError(f"{where}: mma was never called: compute the products with the "
                                "tensor core's instruction, mma(part, a_chunk, b_chunk)")
        fed = sum(sizes)
        if fed > K:
            raise ExerciseError(
                f"{where}: mma was given {fed} values of K, where K = {K}: the chunks of a K "
                "block run past its end into the next block's (off by one: block j covers "
                "j * 128 up to, not including, (j + 1) * 128 and K), or a block is added twice")
        if max(log) > 128:
            raise ExerciseError(
                f"{where}: the tensor core's accumulator held {max(log)} products before it "
                "was emptied: the partial sum was never promoted (pass a zero partial to mma "
                "at the start of every 128-wide K block, after adding the last one, scaled, "
                "into the fp32 accumulator)")
        if fed < K:
            raise ExerciseError(f"{where}: mma was given {fed} of K = {K} values: the last, "
                                f"partial K block (K % 128 = {K % 128}) is dropped; loop over "
                                "ceil(K / 128) blocks")
        if K > 32 and max(log) <= 32:
            raise ExerciseError(
                f"{where}: every mma started from a zero partial: the partial was promoted "
                "after every instruction (32 products), four times per 128-wide K block. The "
                "numbers come out right, but each promotion is an fp32 multiply-add per "
                "element on the CUDA cores: promote once per 128-wide K block, when its scales "
                "change (a zero partial at the block's start, its 4 chunks into it)")
        ref = _dequant_ref(qa, sa, qb, _per_column(sb, N))
        rel = ((got - ref).norm() / ref.norm()).item()
        if not rel < 1e-3:
            cause = _promotion_cause(got, qa, sa, qb, sb, N)
            raise ExerciseError(f"{where}: relative error {rel:.2e} against float64 of the "
                                f"dequantized operands. Likely cause: {cause}")
        # the probe: mma's products doubled (exact) must double the result, if it comes
        # from mma's partial sums
        probe = make_mma(gain=2.0)
        with run_answer("blockscaled_dot"), no_package_calls("blockscaled_dot", allowed=(probe,)), \
                _scale_errors(where):
            twice = blockscaled_dot(qa.clone(), sa.clone(), qb.clone(), sb.clone(), probe)
        twice = _tensor(twice, "blockscaled_dot", (M, N)).double()
        if not ((twice - 2 * got).norm() <= 1e-6 * got.norm()).item():
            raise ExerciseError(
                f"{where}: the result does not come from what mma returns (an mma whose "
                "products were doubled left it unchanged): the partial sums are the tensor "
                "core's, and the fp32 accumulator adds them, scaled; no product computed "
                "beside mma")
    return ("blockscaled_dot: each 128-wide K block from zero, scaled, promoted to fp32: "
            f"right on {len(cases)} shapes")


def _promotion_cause(got, qa, sa, qb, sb, N):
    """A wrong result read as the product with the scales changed one way (the float64
    product of the dequantized operands, with other scales)."""
    M, kb = sa.shape
    cols = _per_column(sb, N)
    variants = [
        ("divided by the scales: q = x / scale, so x = q * scale: multiply the partial by "
         "them", (1 / sa, 1 / cols)),
        ("B's scale: a column n uses sb[j, n // 128] (its 128-wide block of columns), not "
         "sb[j, n % ...] or one scale for the whole row of blocks",
         (sa, sb[:, :1].expand(kb, N))),
        ("the scales are applied once, with the first block's, after the K loop: each K "
         "block's partial takes its own scales, before it joins the accumulator",
         (sa[:, :1].expand(M, kb), cols[:1].expand(kb, N))),
        ("A's scale: row m's scale for K block j is sa[m, j]", (sa[:, :1].expand(M, kb), cols)),
    ]
    if M == N:
        variants.append(("A's scale is per row: sa[:, j] is a vector, which broadcasts along "
                         "N, so column n got row n's scale; keep a column, sa[:, j:j + 1]",
                         (torch.ones_like(sa), cols * sa.T)))
    for cause, (va, vb) in variants:
        alt = _dequant_ref(qa, va, qb, vb)
        if ((got - alt).norm() / alt.norm()).item() < 1e-2:
            return cause
    return ("each K block's partial, from zero, times sa[:, j] (per row) and sb[j, n // 128] "
            "(per column), added into the fp32 accumulator")


# ------------------------------------------------------------------ exercise 4: the scale's index
def _true_offsets(rows, cols, br, bc):
    """Where each element's scale is, read from the package's quantizer (the shape of its
    scale buffer) and its expansion of the scales to the elements: no formula of the
    check's own."""
    from .. import fp8
    shape = fp8.quantize(torch.ones(rows, cols), (br, bc))[1].shape
    ids = torch.arange(shape.numel()).reshape(shape)
    return fp8.expand_scales(ids, (rows, cols), (br, bc)), shape


def ex11_scale_offsets(scale_offsets):
    """Lesson 11, exercise 4: the flat offset, in a row-major buffer of block scales, of the
    scale of element (i, j) of a (rows, cols) matrix cut into (br, bc) blocks."""
    cases = [((300, 260), (128, 128)), ((5, 300), (1, 128)), ((200, 129), (128, 128)),
             ((70, 90), (32, 64)), ((256, 256), (128, 128)), ((4, 256), (1, 128)),
             ((1, 1), (128, 128))]
    for (rows, cols), (br, bc) in cases:
        i = torch.arange(rows).repeat_interleave(cols)
        j = torch.arange(cols).repeat(rows)
        with run_answer("scale_offsets"), no_package_calls("scale_offsets"):
            got = scale_offsets(i.clone(), j.clone(), rows, cols, br, bc)
        got = _tensor(got, "scale_offsets", i.shape).long()
        table, (n_br, n_bc) = _true_offsets(rows, cols, br, bc)
        want = table[i, j]
        bad = (got != want).nonzero()
        if len(bad):
            k = int(bad[0])
            ii, jj = int(i[k]), int(j[k])
            g, w = int(got[k]), int(want[k])
            where = (f"({rows} x {cols} matrix, {br} x {bc} blocks): element ({ii}, {jj}) "
                     f"got offset {g}, expected {w} (block row {ii // br}, block column "
                     f"{jj // bc}, {n_bc} blocks per row)")
            cause = _offset_cause(got, want, rows, cols, br, bc, n_br, n_bc)
            raise ExerciseError(f"scale_offsets {where}. Likely cause: {cause}")
    return f"scale_offsets: every element's block scale found on {len(cases)} layouts"


def _constant_on(got, table):
    """Whether ``got`` takes one value on each group of elements that share a value of
    ``table`` (both in the elements' row-major order)."""
    t = table.flatten()
    order = torch.argsort(t, stable=True)
    t, g = t[order], got[order]
    return not bool(((g[1:] != g[:-1]) & (t[1:] == t[:-1])).any())


def _offset_cause(got, want, rows, cols, br, bc, n_br, n_bc):
    """The likely mistake, from properties of the offsets (read against the package's own
    table of where each scale is, never against a formula of the check's)."""
    b_row, b_col = want // n_bc, want % n_bc          # the buffer's layout: n_bc per band
    if _constant_on(got, want):
        lower = b_row >= 1
        if bool(lower.any()) and bool((got[~lower] == b_col[~lower]).all()):
            per = (got[lower] - b_col[lower]) // b_row[lower]
            if bool(((per * b_row[lower] + b_col[lower]) == got[lower]).all()) \
                    and len(torch.unique(per)) == 1:
                P = int(per[0])
                named = {cols // bc: f"not cols // bc = {cols // bc}: a ragged last block counts",
                         cols // bc + 1: f"not cols // bc + 1 = {cols // bc + 1}, one too many "
                                         "where bc divides cols: (cols + bc - 1) // bc",
                         (cols - 1) // bc: f"not (cols - 1) // bc = {(cols - 1) // bc}: "
                                           "(cols + bc - 1) // bc",
                         -(-rows // br): "not the number of block rows, ceil(rows / br): a "
                                         "band holds one scale per block column",
                         cols: "not one per column: one per block of bc columns"}
                why = named.get(P, "one per block column of the band")
                return (f"the blocks per row: your offsets put {P} scales in each band of "
                        f"{br} rows; a band holds ceil(cols / bc) = {n_bc} scales, {why}")
        if bool((got == b_col * n_br + b_row).all()):
            return ("the buffer is row-major over the blocks: offset = block_row * "
                    "blocks_per_row + block_col")
        return "offset = block_row * ceil(cols / bc) + block_col"
    swapped, _ = _true_offsets(rows, cols, bc, br)
    if (br, bc) != (bc, br) and _constant_on(got, swapped[:rows, :cols]):
        return "rows are cut by br and columns by bc: the two block sizes swapped"
    return ("elements of one block got different offsets: the block of an index is i // br "
            "(which block), not i % br (where in the block) nor i itself")
