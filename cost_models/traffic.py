"""Bytes a piece moves per training step, by where they move.

Notation (docs/DESIGN.md, "Cost model"): b the per-GPU batch, W the GPUs, G GPUs per host,
B = b*W, p the pooling factor (ids per sample, summed over the table's features), n the
table's bags per sample (one per feature: 1 for a table read by one feature), d the piece's
columns, r its share of the table's ids. A sharded piece serves all B samples (B*n bags); a
data-parallel replica serves its own b. A sequence table (unpooled) returns one vector per id
instead of one per bag: B*p*r vectors from a piece (output_vectors).

Every byte count here is what the executor must measure on the wire or in memory, so these
functions are the single definition of the model's byte counts; `cost.py` only divides.
"""

from dataclasses import dataclass

from cost_models import latency
from cost_models.cache_policy import policy_hit_rate
from cost_models.geometry import ModelGeom, TableGeom, cache_rows
from cost_models.hardware import HardwareProfile
from cost_models.sizes import comm_row_bytes, optimizer_state_row_bytes, weight_row_bytes
from cost_models.types import ShardingType, Tier
from cost_models.unique_rows import piece_unique_rows, unique_rows, unique_rows_hot

# Bytes per element of the pooled gradients the backward reads (fp32, as the executor's).
GRAD_BYTES = 4

# Row-split types that reduce partial sums inside a host before crossing hosts.
_HOST_REDUCED = (ShardingType.TABLE_ROW_WISE, ShardingType.GRID)


@dataclass(frozen=True)
class PieceTraffic:
    """Bytes per step for one piece on its GPU. intra = over NVLink, inter = over the NIC."""

    lookups: float  # rows read per step (forward)
    hbm_fwd: float  # forward bytes served from HBM (rows and the ids read)
    hbm_bwd: float  # backward + fused-optimizer bytes served from HBM
    host: float  # bytes read/written in host DDR over PCIe (cache misses, ddr and ssd tiers)
    ssd: float  # bytes read/written on the SSD (page-granular)
    ids_intra: float  # input all-to-all: id and bag-length bytes received from the same host
    ids_inter: float  # ... and from other hosts
    out_fwd_intra: float  # output all-to-all, forward: pooled vectors / partial sums sent
    out_fwd_inter: float
    out_bwd_intra: float  # output all-to-all, backward: gradients of the pooled vectors
    out_bwd_inter: float
    allreduce: float  # data-parallel gradient all-reduce bytes sent per GPU (ring)
    # The other side of the all-to-alls, per sample: bytes the GPU owning a sample sends to
    # this piece (ids) and exchanges with it (pooled vector forward, its gradient backward).
    # How many of these cross hosts depends on where the pieces are: see placement.py.
    owner_ids: float = 0.0
    owner_out_fwd: float = 0.0
    owner_out_bwd: float = 0.0
    # Of ids_intra + ids_inter, the bag lengths: one per bag (a sample of one of the table's
    # features) per piece, whatever the ids.
    lengths: float = 0.0
    # Not bytes: distinct rows the backward updates per step (unique_rows.py; a replica's
    # lookups, its update being dense), and a replica's share of the all-reduce calls.
    unique_rows: float = 0.0
    # Rows the backward's update reads and writes: the distinct rows, or a replica's every
    # row (its dense optimizer step); and a cached piece's cache slots.
    updated_rows: float = 0.0
    cache_slots: float = 0.0
    cache_probes: float = 0.0  # ids looked up in a cache on the GPU (hbm_cache)
    allreduce_calls: float = 0.0
    # Shares of hbm_fwd and hbm_bwd the device's own cache serves (hardware constant
    # device_cache_bytes; 0 when it is 0): device_resident's.
    resident_fwd: float = 0.0
    resident_bwd: float = 0.0


def device_resident(cache_bytes: int, rows: int, row_bytes: int) -> float:
    """Share of a piece's row reads its device's cache serves: the share of its rows that fit
    (rows read uniformly: a skewed table's hot rows stay longer, so this errs slow)."""
    if cache_bytes <= 0 or rows <= 0 or row_bytes <= 0:
        return 0.0
    return min(1.0, cache_bytes / (rows * row_bytes))


def hit_rate(table: TableGeom, tier: Tier, cache_ratio: float, piece_rows: int) -> float:
    """Fraction of lookups served by the fast level of the tier: HBM for hbm and hbm_cache,
    the DDR cache for ssd, nothing for ddr.

    The piece's cache holds `cache_rows(cache_ratio, piece_rows)` rows (what memory.py
    reserves); with ids spread evenly over row ranges, that is the same share of the table's
    hottest rows, so the table's curve is read at cached * rows / piece_rows rows, under the
    table's cache policy (cache_policy.py: LFU's steady state, or LRU by Che's approximation).
    """
    if tier is Tier.HBM:
        return 1.0
    if tier is Tier.DDR:
        return 0.0
    cached = cache_rows(cache_ratio, piece_rows)
    equivalent = cached * table.rows // piece_rows
    return policy_hit_rate(table.access, table.cache_policy, equivalent, table.rows)


def _unique_hit(table: TableGeom, cache_ratio: float, piece_rows: int,
                table_lookups: float) -> float:
    """Share of a batch's distinct rows that a piece's cache holds: its rows read on the
    table's curve as hit_rate reads them, the hottest `equivalent` rows of the table."""
    all_rows = unique_rows(table.access, table.rows, table_lookups)
    if all_rows <= 0:
        return 1.0
    equivalent = cache_rows(cache_ratio, piece_rows) * table.rows // piece_rows
    return min(1.0, unique_rows_hot(table.access, table.rows, table_lookups, equivalent)
               / all_rows)


def piece_traffic(
    table: TableGeom,
    kind: ShardingType,
    tier: Tier,
    cache_ratio: float,
    piece_rows: int,
    piece_cols: int,
    hw: HardwareProfile,
    model: ModelGeom,
) -> PieceTraffic:
    """Bytes one piece of `kind` with `piece_rows` x `piece_cols` moves per step."""
    c = hw.constants
    world, g = hw.world_size, hw.gpus_per_host
    if kind is ShardingType.DATA_PARALLEL:
        samples = float(model.batch_per_gpu)
        id_share = 1.0
    else:
        samples = float(model.batch_per_gpu * world)
        id_share = piece_rows / table.rows
    lookups = samples * table.pooling * id_share
    w_row = weight_row_bytes(table.data_type, piece_cols)
    s_row = optimizer_state_row_bytes(table.optimizer, piece_cols)
    fwd = lookups * w_row
    # Fused backward (kernels.row_grads_bags, then the store's update): each lookup reads its
    # sample's pooled gradient (fp32), then the optimizer reads and writes each *distinct*
    # row of the batch and its state once (unique_rows.py), not once per lookup.
    unique = (lookups if kind is ShardingType.DATA_PARALLEL else
              piece_unique_rows(table.access, table.rows, samples * table.pooling, id_share))
    grad_reads = lookups * GRAD_BYTES * piece_cols
    bwd_w = unique * 2 * w_row
    bwd_s = unique * 2 * s_row
    bwd = bwd_w + bwd_s + grad_reads
    ids_read = lookups * c.id_bytes

    h = hit_rate(table, tier, cache_ratio, piece_rows)
    if tier is Tier.HBM:
        hbm_fwd, hbm_bwd, host, ssd = fwd + ids_read, bwd, 0.0, 0.0
    elif tier is Tier.HBM_CACHE:
        # The cache holds weight rows only; optimizer state stays in DDR (memory.py).
        # The backward updates each distinct row once: in the cache for those among the rows
        # it holds (the hottest, as LFU settles; LRU's are taken alike), over PCIe for the
        # rest. Distinct rows miss more often than lookups do: a hot row counts once.
        h_u = _unique_hit(table, cache_ratio, piece_rows, samples * table.pooling)
        hbm_fwd, hbm_bwd = h * fwd + ids_read, h_u * bwd_w + grad_reads
        host = (1.0 - h) * fwd + (1.0 - h_u) * bwd_w + bwd_s
        ssd = 0.0
    else:
        hbm_fwd, hbm_bwd = ids_read, grad_reads
        host = fwd + bwd_w + bwd_s
        # ssd: DDR-cache misses read the row from SSD and write it back, a page at least.
        page = max(w_row + s_row, c.ssd_read_granularity_bytes)
        ssd = (1.0 - h) * lookups * 2 * page if tier is Tier.SSD else 0.0

    allreduce = 0.0
    allreduce_calls = 0.0
    owner = (0.0, 0.0, 0.0)
    lengths_recv = 0.0
    if kind is ShardingType.DATA_PARALLEL:
        ids_intra = ids_inter = 0.0
        out = (0.0, 0.0, 0.0, 0.0)
        # No fused per-lookup update for a replica: the backward scatters one gradient row
        # per lookup, then a dense optimizer step runs over the whole replica after the
        # all-reduce (read and write weights and state).
        hbm_bwd = lookups * w_row + table.rows * 2 * (w_row + s_row)
        grad_bytes = table.rows * comm_row_bytes(model.bwd_precision, piece_cols)
        allreduce = 2.0 * (world - 1) / world * grad_bytes
        allreduce_calls = latency.allreduce_calls(grad_bytes, c.allreduce_bucket_bytes)
    else:
        # Every bag (a sample of one of the table's features) sends the piece its length,
        # even an empty bag (a row-split piece).
        bags = samples * table.bags
        lengths = bags * c.length_bytes
        ids = lookups * c.id_bytes + lengths
        ids_intra = ids * (g - 1) / world
        ids_inter = ids * (world - g) / world
        lengths_recv = lengths * (world - 1) / world
        # One vector per output: a pooled table's per bag (a table read by k features sends
        # k per sample; a row-split piece a partial sum per bag), a sequence table's per id,
        # and a row-split piece of one only those of its own ids.
        out = _output_bytes(kind, output_vectors(table, samples, id_share), piece_cols, g,
                            world, model)
        # Host-reduced pieces (TWRW, grid) send one reduced vector per bag per host.
        per_sample = output_vectors(table, 1.0, id_share)
        share = per_sample / g if kind in _HOST_REDUCED else per_sample
        owner = (table.pooling * id_share * c.id_bytes + table.bags * c.length_bytes,
                 comm_row_bytes(model.fwd_precision, piece_cols) * share,
                 comm_row_bytes(model.bwd_precision, piece_cols) * share)

    return PieceTraffic(
        lookups=lookups,
        hbm_fwd=hbm_fwd,
        hbm_bwd=hbm_bwd,
        host=host,
        ssd=ssd,
        ids_intra=ids_intra,
        ids_inter=ids_inter,
        out_fwd_intra=out[0],
        out_fwd_inter=out[1],
        out_bwd_intra=out[2],
        out_bwd_inter=out[3],
        allreduce=allreduce,
        owner_ids=owner[0],
        owner_out_fwd=owner[1],
        owner_out_bwd=owner[2],
        lengths=lengths_recv,
        unique_rows=unique,
        updated_rows=float(table.rows) if kind is ShardingType.DATA_PARALLEL else unique,
        cache_slots=(float(cache_rows(cache_ratio, piece_rows))
                     if tier in (Tier.HBM_CACHE, Tier.SSD) else 0.0),
        cache_probes=lookups if tier is Tier.HBM_CACHE else 0.0,
        allreduce_calls=allreduce_calls if world > 1 else 0.0,
        # An hbm piece's (or replica's) rows in the device cache: the forward reads weights,
        # the backward weights and optimizer state.
        resident_fwd=(device_resident(c.device_cache_bytes, piece_rows, w_row)
                      if tier is Tier.HBM else 0.0),
        resident_bwd=(device_resident(c.device_cache_bytes, piece_rows, w_row + s_row)
                      if tier is Tier.HBM else 0.0),
    )


def output_vectors(table: TableGeom, samples: float, id_share: float) -> float:
    """Vectors a sharded piece sends its samples' owners in the forward output all-to-all
    (and gets their gradients back), for `samples` samples: a pooled table's one per bag
    (samples x bags), whatever the piece's rows; a sequence table's one per id, of the ids in
    the piece's rows (samples x pooling x id_share: all of them for table- and column-wise
    pieces, no partial sums to reduce)."""
    if table.sequence:
        return samples * table.outputs * id_share
    return samples * table.outputs


def _output_bytes(
    kind: ShardingType, samples: float, cols: int, g: int, world: int, model: ModelGeom
) -> tuple[float, float, float, float]:
    """(fwd intra, fwd inter, bwd intra, bwd inter) bytes of the output all-to-all of
    `samples` vectors (output_vectors: one per bag, or per id of a sequence table).

    Table-, column-wise and row-wise pieces send one vector (a pooled vector, or a partial sum
    for row-wise: reduce-scatter volume) per sample to the sample's owner: (G-1)/W of them on
    the same host, (W-G)/W on other hosts. Table-row-wise and grid pieces reduce-scatter inside
    the host first ((G-1)/G of the vectors over NVLink), then each GPU sends the reduced B/G
    vectors it holds to their owners on the other hosts ((W-G)/W of those cross hosts).
    """
    fwd_row = comm_row_bytes(model.fwd_precision, cols)
    bwd_row = comm_row_bytes(model.bwd_precision, cols)
    if kind in _HOST_REDUCED:
        intra_share = (g - 1) / g
        inter_share = (world - g) / (world * g)
    else:
        intra_share = (g - 1) / world
        inter_share = (world - g) / world
    return (
        samples * fwd_row * intra_share,
        samples * fwd_row * inter_share,
        samples * bwd_row * intra_share,
        samples * bwd_row * inter_share,
    )
