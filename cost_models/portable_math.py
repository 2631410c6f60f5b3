"""exp, expm1, log, log1p, power and dot products over float64 arrays (and exp, log and power
over Python floats: fexp, flog, fpow), the same bits on every machine.

numpy picks its transcendental kernels at import time from the CPU's SIMD features: on a
machine with AVX-512 its exp, expm1, log, log1p and power give results a unit in the last
place away from those of an AVX2 machine. The cost model reads hit rates and distinct rows
through them, and a last-bit difference in one candidate's price can change which of two
tied moves the search takes: the same request then gave different plans on two machines
(hugectr_510 x 1 h100 host: 16.886 against 16.908 ms, planned with numpy's AVX-512 kernels
on and off). The C library's exp, log and pow, which Python's math and float ** call, differ
between systems too (glibc picks FMA variants by CPU; macOS has its own).

These functions use only additions, multiplications, divisions, comparisons, rint, frexp and
ldexp, which IEEE 754 defines exactly, so every machine computes the same bits. The float
versions run the same operations in the same order as the array ones, bit for bit. The
kernels are fdlibm's (Sun, 1993; the algorithms of its e_exp.c and e_log.c, with their
minimax coefficients), written branch-free over arrays.

Matrix products go through BLAS, whose kernel numpy's OpenBLAS also picks by CPU (a plan's
bytes changed with OPENBLAS_CORETYPE: zionex_12t x 4 h100 hosts): `dot_last` sums in a fixed
order with separate multiplications and additions instead.

Accuracy, against Python's math (tests/test_portable_math.py): exp and log within 1 unit in
the last place, log1p within 2, expm1 within 4. power rounds y * log(x) once before exp, so
its error grows with |y log x|: within 32 units (7e-15) for zipf exponents up to 1.6 and
10**9 rows, about 400 (5e-14) at exponent 10 and 10**13 rows, far below anything the cost
model resolves.

Checked on one x86-64 machine (Intel, AVX-512) by planning with numpy's dispatched kernels
and OpenBLAS's CPU-specific ones switched off; `tests/test_portable_math.py` also holds the
kernels' output bits on fixed inputs to the values recorded there, which checks other
machines (ARM, macOS) wherever the tests run.
"""

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

F64 = NDArray[np.float64]

# ln 2 split in two: _LN2_HI has its low 32 bits zero, so k * _LN2_HI is exact for
# |k| < 2**20 and the argument reduction loses nothing.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e00
_HALF_LN2 = 0.34657359027997264
# Beyond these exp is 0 or inf in float64; clipping keeps k in int range.
_EXP_CLIP = 1100.0
# exp(r) = 1 + 2r / (2 - c(r)) on |r| <= ln(2) / 2, c(r) = r - r**2 * P(r**2): fdlibm's
# minimax P (error below 2**-59).
_P1 = 1.66666666666666019037e-01
_P2 = -2.77777777770155933842e-03
_P3 = 6.61375632143793436117e-05
_P4 = -1.65339022054652515390e-06
_P5 = 4.13813679705723846039e-08
# log(1 + f) = f - f**2/2 + s * (f**2/2 + R(s**2)), s = f / (2 + f), sqrt(1/2) <= 1 + f <
# sqrt(2): fdlibm's minimax R (error below 2**-58.45).
_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01
_SQRT_HALF = 0.70710678118654752440


def _as_array(x: ArrayLike) -> F64:
    return np.asarray(x, dtype=np.float64)


def _positive_finite(a: F64) -> bool:
    """Every element finite and above 0 (the fast paths' case; nan fails it)."""
    return bool(a.size and a.min() > 0 and a.max() < np.inf)


def _c(r: F64) -> F64:
    """r - t * P(t), t = r**2, Horner's rule in place (the same operations, in the same
    order, as the float twin _fc)."""
    t = r * r
    acc = t * _P5
    for p in (_P4, _P3, _P2, _P1):
        acc += p
        acc *= t
    return np.subtract(r, acc, out=acc)


def _exp_flat(a: F64) -> F64:
    a = np.clip(a, -_EXP_CLIP, _EXP_CLIP)
    k = a * _INV_LN2
    np.rint(k, out=k)
    hi = k * _LN2_HI
    np.subtract(a, hi, out=hi)
    lo = k * _LN2_LO
    r = hi - lo
    c = _c(r)
    # y = 1 - ((lo - r * c / (2 - c)) - hi), in place
    q = np.multiply(r, c, out=r)
    np.subtract(2.0, c, out=c)
    q /= c
    np.subtract(lo, q, out=q)
    q -= hi
    np.subtract(1.0, q, out=q)
    # A nan's k casts to an arbitrary integer: ldexp keeps the nan whatever it is.
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        return np.ldexp(q, k.astype(np.int64))


def exp(x: ArrayLike) -> F64:
    """e**x, elementwise (0-d for a scalar); nan stays nan."""
    a = _as_array(x)
    return _exp_flat(np.atleast_1d(a)).reshape(a.shape)


def _expm1_small(r: F64) -> F64:
    """e**r - 1 for |r| <= ln(2) / 2: r + r * c / (2 - c), exp's kernel without the 1."""
    c = _c(r)
    q = r * c
    np.subtract(2.0, c, out=c)
    q /= c
    return np.add(r, q, out=q)


def expm1(x: ArrayLike) -> F64:
    """e**x - 1, accurate near 0 as well."""
    a = _as_array(x)
    flat = np.atleast_1d(a)
    small = np.abs(flat) <= _HALF_LN2
    if small.all():
        out = _expm1_small(flat)
    elif not small.any():
        out = _exp_flat(flat) - 1.0
    else:
        out = np.empty_like(flat)
        out[small] = _expm1_small(flat[small])
        large = ~small
        out[large] = _exp_flat(flat[large]) - 1.0
    return out.reshape(a.shape)


def _log_positive(a: F64) -> F64:
    """log over positive finite values (at least 1-d)."""
    m, e = np.frexp(a)
    low = m < _SQRT_HALF
    f = 1.0 + low
    f *= m  # exact: m * 2 is
    f -= 1.0  # exact: m lies within a factor 2 of 1
    k = e - low
    s = 2.0 + f
    np.divide(f, s, out=s)
    z = s * s
    w = z * z
    # r = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7))) + w * (LG2 + w * (LG4 + w * LG6))
    r = w * _LG7
    for lg in (_LG5, _LG3):
        r += lg
        r *= w
    r += _LG1
    r *= z
    t = w * _LG6
    for lg in (_LG4, _LG2):
        t += lg
        t *= w
    r += t
    # k ln2_hi - ((hfsq - (s (hfsq + r) + k ln2_lo)) - f), hfsq = f**2 / 2
    hfsq = 0.5 * f
    hfsq *= f
    r += hfsq
    r *= s
    r += k * _LN2_LO
    np.subtract(hfsq, r, out=r)
    r -= f
    out = k * _LN2_HI
    out -= r
    return out


def log(x: ArrayLike) -> F64:
    """Natural logarithm: -inf at 0, inf at inf, nan below 0 and at nan."""
    a = _as_array(x)
    if _positive_finite(a):
        return _log_positive(np.atleast_1d(a)).reshape(a.shape)
    ok = np.isfinite(a) & (a > 0)
    out = _log_positive(np.atleast_1d(np.where(ok, a, 1.0))).reshape(a.shape)
    out = np.where(a == 0, -np.inf, out)
    out = np.where(a == np.inf, np.inf, out)
    return np.where(np.isnan(a) | (a < 0), np.nan, out)


def log1p(x: ArrayLike) -> F64:
    """log(1 + x), accurate near 0 (Goldberg: log(u) * x / (u - 1) with u = 1 + x)."""
    a = _as_array(x)
    u = 1.0 + a
    d = u - 1.0
    if _positive_finite(u) and d.all():
        return _log_positive(np.atleast_1d(u)).reshape(u.shape) * (a / d)
    safe = (d != 0) & np.isfinite(u)
    ratio = a / np.where(safe, d, 1.0)
    with np.errstate(invalid="ignore"):
        out = np.where(safe, log(u) * ratio, a)
    return np.where(np.isinf(u) | np.isnan(u), u, out)


def power(x: ArrayLike, y: ArrayLike) -> F64:
    """x**y for x >= 0 (x = 0: 0, 1 or inf as y is positive, zero or negative); nan for
    x < 0."""
    a, b = _as_array(x), _as_array(y)
    if a.ndim == 0 and 0 < a < np.inf:
        return exp(b * flog(float(a)))
    if _positive_finite(a):
        return exp(b * _log_positive(np.atleast_1d(a)).reshape(a.shape))
    a, b = np.broadcast_arrays(a, b)
    positive = a > 0
    out = exp(b * log(np.where(positive, a, 1.0)))
    zero = np.where(b > 0, 0.0, np.where(b == 0, 1.0, np.inf))
    out = np.where(positive, out, np.where(a == 0, zero, np.nan))
    return np.where(b == 0, 1.0, out)


def dot_last(a: ArrayLike, v: ArrayLike) -> F64:
    """a @ v over a's last axis (v 1-D), summed left to right, without BLAS."""
    m, w = _as_array(a), _as_array(v)
    if w.ndim != 1 or m.shape[-1] != w.shape[0]:
        raise ValueError(f"dot_last: shapes {m.shape} and {w.shape} do not align")
    out = m[..., 0] * w[0]
    for j in range(1, w.shape[0]):
        out = out + m[..., j] * w[j]
    return out


# The same kernels over Python floats: every operation a float operation in the same order
# as the array versions' (Python's round is round-half-even like rint; math.frexp and
# math.ldexp are exact), so fexp(x) == exp(x) bit for bit.


def _fc(r: float) -> float:
    t = r * r
    return r - t * (_P1 + t * (_P2 + t * (_P3 + t * (_P4 + t * _P5))))


def fexp(x: float) -> float:
    """e**x over a float, as `exp`."""
    if x != x:
        return x
    a = min(max(x, -_EXP_CLIP), _EXP_CLIP)
    k = round(a * _INV_LN2)
    hi = a - k * _LN2_HI
    lo = k * _LN2_LO
    r = hi - lo
    c = _fc(r)
    y = 1.0 - ((lo - (r * c) / (2.0 - c)) - hi)
    try:
        return math.ldexp(y, k)
    except OverflowError:
        return math.inf


def flog(x: float) -> float:
    """Natural logarithm of a float, as `log`."""
    if not x > 0:
        return -math.inf if x == 0 else math.nan
    if x == math.inf:
        return x
    m, e = math.frexp(x)
    low = m < _SQRT_HALF
    f = m * (1.0 + low) - 1.0
    k = e - low
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    r = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7))) + w * (_LG2 + w * (_LG4 + w * _LG6))
    hfsq = 0.5 * f * f
    return k * _LN2_HI - ((hfsq - (s * (hfsq + r) + k * _LN2_LO)) - f)


def fpow(x: float, y: float) -> float:
    """x**y over floats with x >= 0, as `power`."""
    if y == 0:
        return 1.0
    if y != y or x != x:
        return math.nan
    if x > 0:
        return fexp(y * flog(x)) if x != math.inf else (math.inf if y > 0 else 0.0)
    if x == 0:
        return 0.0 if y > 0 else math.inf
    return math.nan
