"""The placement-dependent part of the all-to-alls: the sample owners' side of the NIC.

Each all-to-all has two sides on every GPU. The piece side (traffic.py) is what a GPU's own
pieces receive (ids, output gradients) or send (pooled vectors); the owner side is what the
GPU, as the owner of its b samples, sends (ids, gradients) to or receives (pooled vectors)
from every piece on *other hosts*. With full-duplex links the phase takes the longer of the
two on the NIC, so per GPU r on host h and per phase:

    owner_r  = b * (sum over all pieces of owner bytes per sample - the same sum over host h)
    extra_r  = max(0, owner_r - piece-side inter-host bytes of r) / NIC bandwidth

The owner side depends on where the pieces are: a host holding a large share of the tables'
outputs receives less over its NICs than one holding little. Summed over all GPUs the two
sides carry the same bytes, so only the time changes, never the byte counts. NVLink traffic
inside a host is counted on the piece side only (NVLink is an order of magnitude faster).
"""

import numpy as np

from cost_models.traffic import PieceTraffic

# The three phases, in this order: ids (owner sends), pooled vectors (owner receives),
# gradients (owner sends).


def owner_deficit(piece_inter: np.ndarray, host_rate: np.ndarray, host_of: np.ndarray,
                  batch_per_gpu: int) -> np.ndarray:
    """(W, 3) bytes by which each GPU's owner side exceeds its own pieces' inter-host bytes,
    per phase (negative where the pieces' side is the longer; zeros on one host).

    piece_inter: (W, 3) inter-host bytes of each GPU's pieces per phase (ids received,
    vectors sent, gradients received). host_rate: (H, 3) owner bytes per sample of the
    pieces on each host. host_of: (W,) host of each rank.
    """
    if host_rate.shape[0] < 2:
        return np.zeros_like(piece_inter)
    total = np.add.reduce(host_rate, axis=0)
    owner = batch_per_gpu * (total[None, :] - host_rate[host_of])
    return owner - piece_inter


def wait_of(deficit: np.ndarray, nic_bw: float) -> np.ndarray:
    """Seconds of owner-side wait for deficits (..., 3): the positive ones, over the NIC."""
    # np.add.reduce is what .sum runs, without its wrapper (called per candidate move).
    return np.add.reduce(np.maximum(deficit, 0.0), axis=-1) / nic_bw


def owner_wait(piece_inter: np.ndarray, host_rate: np.ndarray, host_of: np.ndarray,
               batch_per_gpu: int, nic_bw: float) -> np.ndarray:
    """Seconds per GPU that the owner side adds beyond the piece side, over the 3 phases."""
    return wait_of(owner_deficit(piece_inter, host_rate, host_of, batch_per_gpu), nic_bw)


def piece_sides(t: PieceTraffic) -> tuple[np.ndarray, np.ndarray]:
    """(piece-side inter-host bytes, owner bytes per sample) of one piece, per phase."""
    return (np.array([t.ids_inter, t.out_fwd_inter, t.out_bwd_inter]),
            np.array([t.owner_ids, t.owner_out_fwd, t.owner_out_bwd]))
