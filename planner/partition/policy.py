"""Every threshold and budget of the partition pipeline (planner/partition/pipeline.py), in
one object, each with the measurement that set it."""

from dataclasses import dataclass


@dataclass(frozen=True)
class SearchPolicy:
    # Local-search step budget: steps, not seconds, so the same request gives the same plan.
    steps_per_table: int = 20
    min_steps: int = 2000
    max_steps: int = 20_000
    # Extra heuristic starts only up to this many tables: the table-wise one pays on few,
    # evenly sized tables (criteo_kaggle); above it neither has won a case, and each costs a
    # local search.
    small_tables: int = 256
    # auto: a plan this close to the bound is good enough; CP-SAT runs only for plans further
    # away, and stops as soon as it gets this close.
    auto_gap: float = 0.01
    # A plan this close to a proven bound is optimal up to the CP-SAT models' resolution:
    # costs in units of 1e-7 of the makespan, rounded down, then summed over up to hundreds of
    # pieces on a GPU or host (criteo_kaggle x 16 hosts: 3e-5 between the plan and the
    # proven bound).
    proven_tol: float = 1e-4
    # auto runs CP-SAT only on models up to this many variables. Every plan CP-SAT improved or
    # proved in benchmarks/results/solvers.md came from a model under 6,000 variables; at
    # hugectr_200 x 16 GPUs (20,000) it spent 8 s and changed nothing (vs_torchrec).
    auto_max_vars: int = 10_000
    # Up to this many hosts the flat exact model; above it the hierarchical one
    # (pipeline.improve), unless the flat model has at most flat_any_hosts_vars variables:
    # deeprecsys_rm3 on 4 h100 hosts (390) is proven optimal by it at 0.5917 ms, where the
    # hierarchical bound was 0.5341.
    flat_max_hosts: int = 2
    flat_any_hosts_vars: int = 2_000
    # Smaller pieces are tried only for a plan more than this above the bound: each share
    # costs a relaxation, a placement and a local search, and every case they improved was
    # over 5% above (hugectr_510 x 2 hosts 7.9%, mixed_2000 x 32 8.8%, synthetic_1000 x 128
    # 15.4%); at 3.4% (synthetic_10000 x 128 hosts) they took 8 s and found nothing.
    shares_min_gap: float = 0.05
    # Shares of the cluster's HBM, DDR and SSD the relaxation may fill, fullest first
    # (partition/lp_start.py). Near full the LP's work falls fast (zionex_12t x 16 zionex_a100
    # hosts: 71.2 ms of average work at 99%, 73.2 at 97%), so the fills are dense there: 99%
    # and 95% took zionex_12t x 4 h100 hosts from 96.49 to 94.62 ms (bound 93.55) and a
    # 1,000-table set on 2 hosts with 16 GiB GPUs from 751.5 to 725.6 ms.
    relaxation_fills: tuple[float, ...] = (1.0, 0.99, 0.97, 0.95, 0.93, 0.88, 0.8)
    # On several hosts, the largest piece the relaxation may choose, as shares of the bound.
    # The relaxation prices work only, and whole tables carry the least; but a GPU holding one
    # large compute-heavy piece sends few pooled vectors and waits on the owner side of the
    # all-to-alls, which smaller pieces let the placement mix away (hugectr_200 x 4 h100
    # hosts: 35.36 ms with pieces up to the bound, 32.51 with pieces up to 0.6 of it;
    # hugectr_510 x 4 47.74 -> 45.69 at 0.35).
    piece_shares: tuple[float, ...] = (1.0, 0.6, 0.45, 0.35, 0.25)

    # Where CP-SAT runs too, ruin and recreate gets this share of the search budget (CP-SAT
    # the rest); where it does not, all of it.
    lns_share: float = 0.5

    def steps(self, tables: int) -> int:
        """The local search's step budget for this many tables."""
        return min(self.max_steps, max(self.min_steps, self.steps_per_table * tables))


DEFAULT_POLICY = SearchPolicy()
