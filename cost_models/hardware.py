"""The hardware profile the cost model reads: capacities, bandwidths and named constants.

Bandwidths are in bytes per second here (the input format takes GB/s = 1e9 bytes/s). Every
efficiency factor and overhead is a named field of `CostConstants`, so calibration from the
executor's measurements can re-fit it without touching the formulas.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CostConstants:
    """Named constants of the analytic model, with where each default comes from.

    hbm_efficiency: share of peak HBM bandwidth a fused embedding-bag kernel reaches on random
        row gathers. FBGEMM TBE benchmarks reach roughly half to two thirds of peak on A100/H100
        for rows of 64-256 fp32 elements; 0.55 is the assumed start, to be re-fitted.
    pcie_efficiency: share of PCIe bandwidth UVM / zero-copy row reads reach. PCIe gen4/gen5
        x16 deliver about 80% of the raw rate to DMA after protocol overhead.
    ddr_efficiency: share of host DDR bandwidth random row reads reach (about 60%, as for
        random 256-512 B accesses on multi-channel DDR4/DDR5).
    ssd_efficiency: share of the SSD's sequential read bandwidth reached by random page reads
        with deep queues (NVMe at QD>=64 gets close to its rated random-read IOPS x 4 KiB).
    nvlink_efficiency, nic_efficiency: share of link bandwidth an all-to-all achieves (NCCL
        all-to-all bus bandwidth reaches ~70% of NVLink and ~80% of RoCE/IB line rate).
    ssd_read_granularity_bytes: an SSD read fetches at least one 4 KiB page, so a missed row
        smaller than a page costs a whole page.
    id_bytes: bytes per sparse id sent in the input all-to-all (int64, TorchRec's default).
    length_bytes: bytes per bag length: the input all-to-all also sends, per sample and per
        piece, how many of the sample's ids follow (int32, as TorchRec's KJT lengths).
    cache_metadata_bytes_per_row: per cache slot, FBGEMM's LXU cache keeps the cached row's
        index (int64) and its LRU/LFU stamp (int64): 16 bytes.
    piece_overhead_s: fixed per-piece cost per step (bookkeeping, forward and backward). FBGEMM
        runs all of a GPU's tables of one kernel group in one fused launch each way (TorchRec
        batches replicas too), so what a piece adds on its own is its share of the launch's
        setup and offsets: well under a microsecond. Not calibrated on a GPU yet; it also keeps
        the planner from splitting a table for nothing. The forward's launch per piece.
    backward_efficiency: share of the forward's effective memory bandwidth the backward and
        fused optimizer reach (they sort ids, gather gradients and scatter rows). 1.0 assumes
        FBGEMM's backward streams as well as its forward; planner calibrate fits it.
    update_launch_s: the backward's launch per piece (unique ids, row gradients, optimizer
        update), seconds; the same assumption as piece_overhead_s until calibrated.
    a2a_call_latency_s, a2a_peer_latency_s: alpha of an all-to-all call, seconds per call
        and per peer (W - 1 peers). nccl-tests' alltoall on 8 NVLink GPUs takes ~15-20 us at
        a few bytes, ~10 us of launch and sync plus ~1 us per peer's send/recv pair.
    allreduce_call_latency_s, allreduce_hop_latency_s: alpha of a ring all-reduce, seconds
        per call and per ring hop (2 (W - 1) hops); nccl-tests' allreduce at 8 B on 8 GPUs
        takes ~20-25 us.
    allreduce_table_hop_s: time per ring hop of each data-parallel table in a call beside the
        call's own latency: the executor encodes, sends in one message, decodes and adds
        each table's chunk apart. 0 in the presets (NCCL reduces DDP's flat bucket in one
        pass); planner calibrate fits it.
    allreduce_bucket_bytes: data-parallel gradients are all-reduced in buckets of at most
        this many bytes, as DDP does (bucket_cap_mb = 25 MiB by default).
    host_piece_overhead_s: fixed time per step of each piece whose rows live in host memory
        (ddr, hbm_cache, ssd tiers: any piece with host or SSD traffic), charged to
        cache_miss beside its bytes: the host-side gathers, scatters and, for a cache, its
        index search and re-admission, launched per piece. 0 by default (the presets' figures
        count bytes only: FBGEMM's UVM and cache kernels are launched with the lookup's, whose
        launch piece_overhead_s holds); planner calibrate fits it on the executor's host-tier
        stores (planner/calibration/bench.py bench_host).
    update_row_s: backward time per row the update reads and writes (a piece's distinct rows
        of the batch; a replica's every row, its optimizer being dense), beside its bytes:
        sorting ids, segment sums and the scatter cost per row, not only per byte. 0 in the
        presets (bytes only); planner calibrate fits it.
    backward_id_s: backward time per id looked up, beside its bytes: sorting the ids and
        routing each one's pooled gradient to its row (FBGEMM's backward sorts them too). 0 in
        the presets; planner calibrate fits it.
    lookup_id_s: lookup time per id a piece serves from HBM (tiers hbm and hbm_cache), beside
        its bytes: each id's row is a random access, and a CPU's caches make one id of a
        large table cost more than its bytes (measured: lookups of 16,384 ids ran 4x the
        bytes-only fit's time). 0 in the presets (a GPU's gathers are priced by their bytes);
        planner calibrate fits it.
    device_cache_bytes, device_cache_fwd_factor, device_cache_bwd_factor: a device's own
        cache (a CPU's L2, a GPU's L2) holds a piece whose rows fit: its share of an hbm
        piece's row reads (traffic.device_resident: the rows that fit, read uniformly) runs
        the factor times faster than eff_hbm_bw, forward and backward. 0 bytes (no such
        term) in the presets: a GPU's L2 is left inside hbm_efficiency. planner calibrate
        picks the size among the machine's cache levels and fits the factors (measured on
        this CPU: lookups of 200,000-row tables ran at 5 GB/s, of 100-row tables at 170;
        with the term the lookup fit's median residual fell from 32% to 13%).
    cache_probe_s: lookup time per id of an hbm_cache piece beside its bytes: finding the id
        among the cached rows and counting it for the eviction policy (an ssd piece's probe
        runs on the host, inside its cache_miss). 0 in the presets (FBGEMM's probe is fused
        into the lookup kernel, priced by its bytes).
    cache_step_s: cache_miss time per step of each cached piece (hbm_cache, ssd) beside
        host_piece_overhead_s: the fixed part of the cache's upkeep (the executor's
        re-ranking runs a score of small operators whatever the cache's size). 0 in the
        presets; planner calibrate fits it.
    cache_slot_s: cache_miss time per cache slot per step: the executor re-ranks every held
        row once a batch (store.py end_step), where FBGEMM's cache works per missed id. 0 in
        the presets; planner calibrate fits it on the executor's caches.
    lookup_start_s, backward_start_s: the extra time of the first piece a GPU runs in its
        step's lookup (backward) phase, which comes right after an all-to-all: once per GPU
        and step, whatever it holds (cost.step_fixed). On this CPU the first lookup after a
        gloo all-to-all ran 40-120 us over the next ones (planner calibrate's compute
        ranks, measured). 0 in the presets; planner calibrate fits them.
    pipeline_overlap: the share of the next batch's input all-to-all that a pipelined step's
        work hides (cost.sides_of). 1 in the presets: TorchRec's sparse-dist train pipeline
        runs the input exchange on a CUDA stream of its own and NCCL moves it on NVLink and
        the NICs' engines beside the kernels (untested here: no multi-GPU run). Where the
        exchange shares a core with the step (a CPU rank) it hides less; planner calibrate
        measures it from the executor's own pipelined and sequential runs.
    """

    hbm_efficiency: float = 0.55
    pcie_efficiency: float = 0.8
    ddr_efficiency: float = 0.6
    ssd_efficiency: float = 0.9
    nvlink_efficiency: float = 0.7
    nic_efficiency: float = 0.8
    ssd_read_granularity_bytes: int = 4096
    id_bytes: int = 8
    length_bytes: int = 4
    cache_metadata_bytes_per_row: int = 16
    piece_overhead_s: float = 5e-7
    update_launch_s: float = 5e-7
    backward_efficiency: float = 1.0
    a2a_call_latency_s: float = 1e-5
    a2a_peer_latency_s: float = 1e-6
    allreduce_call_latency_s: float = 1e-5
    allreduce_hop_latency_s: float = 1e-6
    allreduce_bucket_bytes: int = 25 * 1024 * 1024
    host_piece_overhead_s: float = 0.0
    update_row_s: float = 0.0
    backward_id_s: float = 0.0
    lookup_id_s: float = 0.0
    device_cache_bytes: int = 0
    device_cache_fwd_factor: float = 1.0
    device_cache_bwd_factor: float = 1.0
    cache_probe_s: float = 0.0
    lookup_start_s: float = 0.0
    backward_start_s: float = 0.0
    cache_step_s: float = 0.0
    allreduce_table_hop_s: float = 0.0
    cache_slot_s: float = 0.0
    pipeline_overlap: float = 1.0


@dataclass(frozen=True)
class HardwareProfile:
    """A cluster of identical hosts, each with `gpus_per_host` identical GPUs."""

    hosts: int
    gpus_per_host: int
    hbm_bytes: int
    hbm_reserved_bytes: int
    hbm_bw: float
    ddr_bytes: int
    ddr_reserved_bytes: int
    ddr_bw: float
    ssd_bytes: int
    ssd_bw: float
    nvlink_bw: float
    nic_bw: float
    pcie_bw: float
    constants: CostConstants = field(default_factory=CostConstants)

    @property
    def world_size(self) -> int:
        return self.hosts * self.gpus_per_host

    @property
    def hbm_cap(self) -> int:
        """HBM left for embeddings per GPU, after the dense model's reservation."""
        return self.hbm_bytes - self.hbm_reserved_bytes

    @property
    def ddr_cap(self) -> int:
        """DDR left for embeddings per host."""
        return self.ddr_bytes - self.ddr_reserved_bytes

    @property
    def ssd_cap(self) -> int:
        return self.ssd_bytes

    def host_of(self, rank: int) -> int:
        return rank // self.gpus_per_host

    # Effective bandwidths, bytes per second, as one GPU sees them.
    @property
    def eff_hbm_bw(self) -> float:
        return self.hbm_bw * self.constants.hbm_efficiency

    @property
    def eff_host_read_bw(self) -> float:
        """A GPU reading host DDR: limited by its PCIe link and by its share of DDR."""
        c = self.constants
        return min(self.pcie_bw * c.pcie_efficiency,
                   self.ddr_bw * c.ddr_efficiency / self.gpus_per_host)

    @property
    def eff_ssd_bw(self) -> float:
        """A GPU's share of the host's SSD read bandwidth."""
        return self.ssd_bw * self.constants.ssd_efficiency / self.gpus_per_host

    @property
    def eff_nvlink_bw(self) -> float:
        return self.nvlink_bw * self.constants.nvlink_efficiency

    @property
    def eff_nic_bw(self) -> float:
        return self.nic_bw * self.constants.nic_efficiency

    @property
    def eff_allreduce_bw(self) -> float:
        """Bus bandwidth of a ring all-reduce (each GPU sends 2(W-1)/W of the buffer).

        Inside one host the ring runs over NVLink. Across hosts NCCL runs one ring per channel,
        each leaving a host through a different GPU's NIC: of what a GPU sends, 1/G crosses
        its NIC and (G-1)/G goes over NVLink, so the slower of the two sets the pace (about
        G NICs' worth for a host of G GPUs, as nccl-tests' multi-node bus bandwidth shows).
        """
        if self.hosts == 1:
            return self.eff_nvlink_bw
        g = self.gpus_per_host
        return 1.0 / max(1.0 / (g * self.eff_nic_bw), (g - 1) / (g * self.eff_nvlink_bw))
