"""Robust least squares for models linear in their constants, with confidence intervals.

Each microbenchmark gives a time t and features x (bytes, calls, peers), and the cost model
says t = sum_j theta_j x_j (latency.py, cost.py). Timings on a shared machine have outliers
(another process takes the core), so the fit minimises a soft-l1 loss of relative residuals
(scipy.optimize.least_squares): a point far off costs linearly, not quadratically. Relative,
because times span orders of magnitude and a 10% error matters as much at 10 us as at 10 ms.

Confidence intervals come from the Jacobian at the optimum: cov = s^2 (J^T J)^-1 with s^2 the
robust residual variance (the loss-weighted squared residuals over n - p), and a Student t
quantile. Constants must be non-negative (a latency or an inverse bandwidth), so the fit is
bounded below by 0; a constant at its bound gets a one-sided interval from 0.
"""

from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats


@dataclass(frozen=True)
class FitResult:
    names: tuple[str, ...]
    values: tuple[float, ...]
    stderr: tuple[float, ...]
    ci95: tuple[tuple[float, float], ...]
    rel_residual_median: float  # median |t_fit / t - 1| over the points
    rel_residual_p90: float
    points: int
    outliers: int  # points off by more than 3 f_scale (relative)

    def value(self, name: str) -> float:
        return self.values[self.names.index(name)]

    def as_dict(self) -> dict[str, object]:
        return {
            "constants": {n: {"value": v, "stderr": s, "ci95": list(c)}
                          for n, v, s, c in zip(self.names, self.values, self.stderr,
                                                self.ci95, strict=True)},
            "rel_residual_median": self.rel_residual_median,
            "rel_residual_p90": self.rel_residual_p90,
            "points": self.points,
            "outliers": self.outliers,
        }


def fit_linear(x: np.ndarray, t: np.ndarray, names: tuple[str, ...], f_scale: float = 0.05,
               loss: str = "soft_l1", offset: np.ndarray | None = None) -> FitResult:
    """Fit t ~ offset + x @ theta, theta >= 0, minimising `loss` of the relative residuals
    (offset + x @ theta - t) / t, soft beyond `f_scale` (5%). `offset`: each point's time
    from constants fitted before (0 by default)."""
    x = np.asarray(x, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    n, p = x.shape
    if n < p:
        raise ValueError(f"{n} points cannot fit {p} constants")
    a = x / t[:, None]  # relative residual = a @ theta - target
    target = np.ones(n) - (0.0 if offset is None else np.asarray(offset, dtype=np.float64) / t)

    def resid(theta: np.ndarray) -> np.ndarray:
        return a @ theta - target

    # Start from the plain non-negative least squares, scaled per column for conditioning.
    scale = np.maximum(np.abs(a).max(axis=0), 1e-300)
    start = optimize.nnls(a / scale, np.maximum(target, 0.0))[0] / scale
    res = optimize.least_squares(resid, start, jac=lambda _: a, bounds=(0.0, np.inf),
                                 loss=loss, f_scale=f_scale, x_scale=1.0 / scale,
                                 method="trf")
    theta = res.x
    r = resid(theta)
    # Robust variance: residuals weighted by the loss's weight at each point (rho'(z)),
    # which down-weights the outliers the loss ignored.
    z = (r / f_scale) ** 2
    w = 1.0 / np.sqrt(1.0 + z) if loss == "soft_l1" else np.ones(n)
    dof = max(n - p, 1)
    s2 = float(np.sum(w * r * r) / max(np.sum(w) * dof / n, 1e-12))
    # In the columns' own scale: features span launches (~1) to bytes (~1e9), so J^T J's
    # eigenvalues span ~1e30, and pinv's cut-off would zero the small columns' variance
    # (an interval of width 0 for a launch term, seen on the H200's calibration).
    jw = a / scale * np.sqrt(w)[:, None]
    se = np.sqrt(np.maximum(np.diag(s2 * np.linalg.pinv(jw.T @ jw)), 0.0)) / scale
    q = float(stats.t.ppf(0.975, dof))
    ci = tuple((max(0.0, float(v - q * s)), float(v + q * s)) for v, s in zip(theta, se,
                                                                              strict=True))
    rel = np.abs(r)
    return FitResult(
        names=names,
        values=tuple(float(v) for v in theta),
        stderr=tuple(float(s) for s in se),
        ci95=ci,
        rel_residual_median=float(np.median(rel)),
        rel_residual_p90=float(np.quantile(rel, 0.9)),
        points=n,
        outliers=int(np.sum(rel > 3 * f_scale)),
    )
