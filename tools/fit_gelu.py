"""Fit the polynomial of ``k09_epilogue.gelu``: log2 Phi(-a) for a = |x| in [0, A_MAX], where
Phi is the standard normal's distribution function (gelu(x) = x * Phi(x)).

Phi(-a) falls from 1/2 to 1e-9 over [0, 6], but its logarithm is smooth and gently curved
(its leading term -a * a / (2 ln 2) for large a), so a polynomial of low degree follows it closely, and one
``ex2`` instruction turns it back: Phi(-a) = 2 ** P(a). Beyond A_MAX, Phi(-a) < 1e-9 and the
kernel uses 0. The fit is least squares on Chebyshev-spaced a, re-weighted towards the worst
points (close to minimax) on the absolute error of log2, i.e. the relative error of Phi;
the round with the smallest largest error is kept.
It prints the coefficients, highest power first (the order of the kernel's Horner lines),
and the largest relative error of Phi(-a), evaluated in float64.

    python tools/fit_gelu.py
"""
from __future__ import annotations

import argparse
import math

import numpy as np

A_MAX = 6.0
DEGREE = 10


def phi_neg(a):
    """Phi(-a) in float64: erfc(a / sqrt 2) / 2."""
    return np.array([0.5 * math.erfc(v / math.sqrt(2)) for v in np.asarray(a, np.float64)])


def fit(a_max=A_MAX, degree=DEGREE, rounds=40):
    """Coefficients c[0] + c[1] a + ... + c[degree] a**degree of log2 Phi(-a): of the
    re-weighted rounds, the one with the smallest largest error on the sample.

    The power basis on [0, 6] is ill-conditioned (a**10 reaches 6e7), so the coefficients
    depend on the machine's LAPACK in their third or fourth digit; the polynomial's values,
    and its error, barely move. Compare fits by their values, not their coefficients."""
    a = (np.cos(np.linspace(0, np.pi, 6000)) * 0.5 + 0.5) * a_max
    f = np.log2(phi_neg(a))
    V = np.vander(a, degree + 1, increasing=True)
    w = np.ones_like(a)
    best = None
    for _ in range(rounds + 1):
        c, *_ = np.linalg.lstsq(V * w[:, None], f * w, rcond=None)
        r = np.abs(V @ c - f)
        if best is None or r.max() < best[0]:
            best = (r.max(), c)
        w = w * (1 + 50 * r / r.max())
    return best[1]


def max_rel_error(c, a_max=A_MAX, n=200001):
    """Largest relative error of 2 ** P(a) against Phi(-a) on [0, a_max], in float64."""
    a = np.linspace(0, a_max, n)
    exact = phi_neg(a)
    return float(np.max(np.abs(np.exp2(np.polyval(c[::-1], a)) - exact) / exact))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--degree", type=int, default=DEGREE)
    ap.add_argument("--a-max", type=float, default=A_MAX)
    args = ap.parse_args(argv)
    c = fit(args.a_max, args.degree)
    print(f"log2 Phi(-a) on [0, {args.a_max}], highest power first:")
    for v in c[::-1]:
        print(f"    {float(v)!r}")
    print(f"max relative error of Phi(-a): {max_rel_error(c, args.a_max):.2e}")


if __name__ == "__main__":
    main()
