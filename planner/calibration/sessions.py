"""Several calibration sessions fitted as one: `planner calibrate --from A --from B ...`.

A session is one earlier `planner calibrate` run, read back from its provenance file (which
keeps every measured point). On a shared machine one session's figures can sit 25% off the
next one's (a slow spell of minutes falls on a whole session), so the combined measurements
take, point by point, the median over the sessions: with three or more, one session's slow
spell does not move a point. Sessions run at different times (before, between and after the
runs a profile is to predict, or on several hosts of a cluster) put the machine's drift
inside the median rather than in the error.

Points line up by position: sessions made with the same options and code measure the same
shapes in the same order. Every term of a point other than its measured figures (MEASURED)
must agree across sessions; a session made otherwise is refused, naming the point and term.
"""

import json
import statistics
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from planner.calibration.bench import Measurements
from planner.errors import BadInputError

# A point's measured figures; every other term is the shape or the model's count for it.
MEASURED = frozenset({"seconds", "lookup_seconds", "sequential_s", "pipelined_s", "input_s",
                      "hit_rate"})
CATEGORIES = tuple(f.name for f in fields(Measurements))
# What a session's provenance says about where and how it ran, kept in the merged one.
_ABOUT = ("command", "date", "host", "platform", "torch", "device", "base_preset")


@dataclass(frozen=True)
class Session:
    """One `planner calibrate` run's measurements and where it ran."""

    path: str
    about: dict[str, Any]
    measurements: Measurements


def load_session(path: Path) -> Session:
    """The session whose provenance file is `path` (or whose profile is: its
    `.provenance.json` beside it is read)."""
    what = f"--from {path}"
    if not path.name.endswith(".provenance.json"):
        side = path.with_suffix(".provenance.json")
        if side.is_file():
            path = side
    try:
        got = json.loads(path.read_text())
    except OSError as exc:
        raise BadInputError(what, f"cannot read it: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInputError(what, f"not a JSON file: {exc}") from None
    points = got.get("measurements") if isinstance(got, dict) else None
    if not isinstance(points, dict):
        raise BadInputError(what, "not a calibration provenance file (no 'measurements'); "
                                  "give the .provenance.json `planner calibrate` wrote")
    lists: dict[str, list[dict[str, Any]]] = {}
    for name in CATEGORIES:
        pts = points.get(name, [])
        if not isinstance(pts, list) or not all(isinstance(p, dict) for p in pts):
            raise BadInputError(what, f"measurements.{name} is not a list of points")
        for i, p in enumerate(pts):
            for k in MEASURED & p.keys():
                v = p[k]
                if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                    raise BadInputError(what, f"measurements.{name}[{i}].{k} is {v!r}, not a "
                                              "number")
        lists[name] = pts
    about = {k: got.get(k) for k in _ABOUT}
    if about["device"] not in ("cpu", "cuda") or not isinstance(about["base_preset"], str):
        raise BadInputError(what, "its provenance names no device (cpu or cuda) or base "
                                  "preset")
    return Session(str(path), about, Measurements(**lists))


def _median_point(name: str, i: int, pts: list[dict[str, Any]], paths: list[str]
                  ) -> dict[str, Any]:
    first = pts[0]
    for p, path in zip(pts[1:], paths[1:], strict=True):
        if p.keys() != first.keys():
            raise BadInputError(f"--from {path}", f"measurements.{name}[{i}] has terms "
                                f"{sorted(p)} where {paths[0]} has {sorted(first)}: the "
                                "sessions were made with different options or code")
        for k, v in p.items():
            if k not in MEASURED and v != first[k]:
                raise BadInputError(f"--from {path}", f"measurements.{name}[{i}].{k} is "
                                    f"{v!r} where {paths[0]} has {first[k]!r}: the sessions "
                                    "measured different shapes (other options or code)")
    out = dict(first)
    for k in MEASURED & first.keys():
        vals = [float(p[k]) for p in pts if p[k] is not None]
        out[k] = statistics.median(vals) if vals else None
    return out


def merge(sessions: list[Session]) -> Measurements:
    """Each point the median over the sessions of its measured figures (the terms checked
    alike)."""
    if not sessions:
        raise BadInputError("--from", "no session given")
    paths = [s.path for s in sessions]
    for key in ("device", "base_preset"):
        seen = {s.about[key] for s in sessions}
        if len(seen) > 1:
            raise BadInputError("--from", f"the sessions' {key} differ ({sorted(seen)}): "
                                          "combine sessions of one device and base preset")
    merged: dict[str, list[dict[str, Any]]] = {}
    for name in CATEGORIES:
        lists = [getattr(s.measurements, name) for s in sessions]
        counts = {len(x) for x in lists}
        if len(counts) > 1:
            raise BadInputError("--from", f"the sessions hold {sorted(counts)} points of "
                                f"measurements.{name}: they were made with different "
                                "options (--world-size, --long, --reps) or code")
        merged[name] = [_median_point(name, i, list(pts), paths)
                        for i, pts in enumerate(zip(*lists, strict=True))]
    return Measurements(**merged)


def spread(sessions: list[Session], merged: Measurements) -> dict[str, Any]:
    """How far the sessions sat apart, per kind of point: each session's median ratio of its
    `seconds` to the merged point's (a session off the others shows as a ratio away from
    1), and the median over points of (max - min) / median across sessions."""
    out: dict[str, Any] = {}
    for name in CATEGORIES:
        mid = [p.get("seconds") for p in getattr(merged, name)]
        if not mid or all(m is None for m in mid):
            continue
        per_session = []
        for s in sessions:
            ratios = [p["seconds"] / m for p, m in zip(getattr(s.measurements, name), mid,
                                                       strict=True)
                      if m and p.get("seconds") is not None]
            per_session.append(statistics.median(ratios) if ratios else None)
        ranges = []
        for i, m in enumerate(mid):
            vals = [float(v) for s in sessions
                    if (v := getattr(s.measurements, name)[i].get("seconds")) is not None]
            if m and len(vals) >= 2:
                ranges.append((max(vals) - min(vals)) / m)
        out[name] = {"session_over_median": per_session,
                     "range_over_median": statistics.median(ranges) if ranges else None}
    return out


def about_sessions(sessions: list[Session]) -> list[dict[str, Any]]:
    """Where and when each session ran, for the merged profile's provenance."""
    return [{"file": s.path, **s.about} for s in sessions]
