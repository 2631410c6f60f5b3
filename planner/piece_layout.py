"""A plan's layout as arrays (struct of arrays), from the partitioner to the plan's edge.

`planning.layout_of` turns an assignment into a `PieceLayout`; `plan_build.build_plan` sums it
per GPU and writes its canonical JSON straight from the arrays. Pydantic objects (`TablePlan`,
`PlanPiece`) are made only for the `Plan` that leaves the library: at 10,000 tables x 1,024
GPUs a plan holds about 1.2 million pieces, and building and dumping them one model at a
time took most of the planning time.
"""

import json
from dataclasses import dataclass

import numpy as np

from cost_models import ShardingType, Tier
from planner.errors import BadInputError
from planner.plan_model import SCHEMA_VERSION, PlanLayout, TablePlan, trusted, trusted_pieces
from planner.spec import ResolvedRequest

# Piece geometry and ranks are int64 here; a foreign layout's beyond this is refused.
_MAX_INT = 2**53
# Canonical JSON (sorted keys, no spaces) of one piece: planner.hashing.canonical_json's form.
_PIECE_JSON = ('{"col_count":%d,"col_offset":%d,"host":%d,"rank":%d,"row_count":%d,'
               '"row_offset":%d}')


@dataclass(frozen=True, eq=False)
class PieceLayout:
    """Per table (in request order): name, sharding type, tier, cache ratio. Per piece, in
    plan order (table by table): rank, host, and (row_offset, row_count, col_offset,
    col_count). Table i's pieces are rows starts[i]:starts[i + 1]."""

    request: ResolvedRequest
    names: tuple[str, ...]
    kinds: tuple[ShardingType, ...]
    tiers: tuple[Tier, ...]
    cache_ratios: tuple[float | None, ...]
    starts: np.ndarray  # (T + 1,) int64
    ranks: np.ndarray  # (P,) int64
    hosts: np.ndarray  # (P,) int64
    geometry: np.ndarray  # (P, 4) int64
    schema_version: str = SCHEMA_VERSION
    # Per table, its piece shapes' per-GPU figures as the candidates costed them
    # (planner.candidates.Candidate.figures); None: plan_build costs them.
    figures: tuple[dict[tuple[int, int], tuple[float, ...]] | None, ...] | None = None

    @property
    def table_of_piece(self) -> np.ndarray:
        """(P,) the index of each piece's table."""
        return np.repeat(np.arange(len(self.names), dtype=np.int64), np.diff(self.starts))

    def tables(self) -> list[TablePlan]:
        """The pydantic tables of the plan that leaves the library (built without
        re-validating what the arrays already hold)."""
        pieces = trusted_pieces(zip(
            self.ranks.tolist(), self.hosts.tolist(),
            *(self.geometry[:, k].tolist() for k in range(4)), strict=True))
        s = self.starts.tolist()
        return [trusted(TablePlan, {"name": name, "sharding_type": kind, "tier": tier,
                                    "cache_ratio": ratio, "pieces": pieces[s[i]:s[i + 1]]})
                for i, (name, kind, tier, ratio) in enumerate(
                    zip(self.names, self.kinds, self.tiers, self.cache_ratios, strict=True))]

    def tables_json(self) -> str:
        """The canonical JSON of `tables()` (what planner.hashing.canonical_json writes for
        it), straight from the arrays: one %-format per table over its pieces' integers."""
        g = self.geometry
        # Per piece, its six integers in the canonical (sorted) key order.
        flat = np.stack([g[:, 3], g[:, 2], self.hosts, self.ranks, g[:, 1], g[:, 0]],
                        axis=1).reshape(-1).tolist()
        s = self.starts.tolist()
        out = []
        for i, (name, kind, tier, ratio) in enumerate(
                zip(self.names, self.kinds, self.tiers, self.cache_ratios, strict=True)):
            n = s[i + 1] - s[i]
            pieces = (",".join([_PIECE_JSON] * n) % tuple(flat[6 * s[i]:6 * s[i + 1]])
                      if n else "")
            out.append('{"cache_ratio":' + json.dumps(ratio) + ',"name":' + json.dumps(name)
                       + ',"pieces":[' + pieces + '],"sharding_type":' + json.dumps(kind.value)
                       + ',"tier":' + json.dumps(tier.value) + "}")
        return "[" + ",".join(out) + "]"


def piece_layout(request: ResolvedRequest, names: list[str], kinds: list[ShardingType],
                 tiers: list[Tier], cache_ratios: list[float | None],
                 geometry: list[np.ndarray], ranks: list[np.ndarray], counts: list[int],
                 gpus_per_host: int,
                 figures: list[dict[tuple[int, int], tuple[float, ...]] | None] | None = None,
                 ) -> PieceLayout:
    """Assemble a layout from per-group arrays (in plan order) and per-table piece counts."""
    geo = (np.concatenate(geometry).astype(np.int64, copy=False).reshape(-1, 4)
           if geometry else np.zeros((0, 4), dtype=np.int64))
    rank = (np.concatenate(ranks).astype(np.int64, copy=False)
            if ranks else np.zeros(0, dtype=np.int64))
    if len(rank) != len(geo):
        raise ValueError(f"{len(rank)} ranks for {len(geo)} pieces")
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    return PieceLayout(request=request, names=tuple(names), kinds=tuple(kinds),
                       tiers=tuple(tiers), cache_ratios=tuple(cache_ratios), starts=starts,
                       ranks=rank, hosts=rank // gpus_per_host, geometry=geo,
                       figures=None if figures is None else tuple(figures))


def from_plan_layout(layout: PlanLayout) -> PieceLayout:
    """The arrays of a pydantic layout (ours, hand-made or imported), its host fields as
    written. Values past 2**53 are refused (no cluster or table has that many)."""
    counts, ranks, hosts, geo = [], [], [], []
    for i, tp in enumerate(layout.tables):
        counts.append(len(tp.pieces))
        for j, pc in enumerate(tp.pieces):
            row = (pc.rank, pc.host, pc.row_offset, pc.row_count, pc.col_offset, pc.col_count)
            if max(row) >= _MAX_INT:
                raise BadInputError(f"tables[{i}].pieces[{j}]", "a value past 2**53",
                                    table=tp.name)
            ranks.append(row[0])
            hosts.append(row[1])
            geo.append(row[2:])
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    return PieceLayout(
        request=layout.request, names=tuple(tp.name for tp in layout.tables),
        kinds=tuple(tp.sharding_type for tp in layout.tables),
        tiers=tuple(tp.tier for tp in layout.tables),
        cache_ratios=tuple(tp.cache_ratio for tp in layout.tables), starts=starts,
        ranks=np.array(ranks, dtype=np.int64), hosts=np.array(hosts, dtype=np.int64),
        geometry=np.array(geo, dtype=np.int64).reshape(-1, 4),
        schema_version=layout.schema_version)
