"""Per-GPU loads and per-tier memory use while pieces are placed, and how one group lands."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from cost_models import CostBreakdown, HardwareProfile, ModelGeom, step_time
from cost_models.placement import owner_deficit, wait_of
from planner.candidates import Candidate, Group, Scope
from planner.problem import Problem

if TYPE_CHECKING:
    from planner.partition.assignment import TableChoice

_INF = float("inf")


@dataclass
class Shortfall:
    """Why a group did not fit: the cap, the bytes it needed and the most that was free."""

    cap: str
    need: int
    free: int


class LoadState:
    """Seconds of compute and communication per GPU; bytes per GPU (HBM) and per host; and
    what the owner side of the all-to-alls needs (cost_models/placement.py): the pieces'
    inter-host bytes per GPU and their owner bytes per sample per host."""

    def __init__(self, hw: HardwareProfile, model: ModelGeom, fixed: CostBreakdown,
                 owner_side: bool = True, spread_hosts: bool = False) -> None:
        self.hw = hw
        self.model = model
        # Among equal GPUs, the one on the least loaded host (_choose_gpu).
        self.spread_hosts = spread_hosts and hw.hosts > 1
        # The greedy builds plans table by table, where the owner side of a half-built plan
        # misleads (measured on synthetic_1000 x 16 hosts: 56.3 ms with it, 54.6 without);
        # it counts the owner side only where the whole plan is there to be judged.
        self.owner_side = owner_side
        self.pipelined = model.pipelined
        self.g = hw.gpus_per_host
        self.w = hw.world_size
        # Every GPU pays what the estimator's `fixed` says whatever it holds (the analytic
        # model's: the step's all-to-all calls, cost.step_fixed).
        fixed_comp, fixed_comm = fixed.sides(model.pipelined, hw.constants.pipeline_overlap)
        self.comp = np.full(self.w, fixed_comp)
        self.comm = np.full(self.w, fixed_comm)
        self.hbm = np.zeros(self.w, dtype=np.int64)
        self.ddr = np.zeros(hw.hosts, dtype=np.int64)
        self.ssd = np.zeros(hw.hosts, dtype=np.int64)
        self.host_of = np.arange(self.w) // self.g
        self._world = np.arange(self.w)
        self.inter = np.zeros((self.w, 3))
        self.rate = np.zeros((hw.hosts, 3))

    @classmethod
    def empty(cls, problem: "Problem", owner_side: bool = True,
              spread_hosts: bool = False) -> "LoadState":
        """The problem's GPUs with nothing placed (their estimator's fixed seconds)."""
        return cls(problem.hw, problem.model, problem.estimator.fixed(), owner_side, spread_hosts)

    @classmethod
    def of_choices(cls, problem: "Problem", choices: "list[TableChoice]") -> "LoadState":
        """The loads and memory of a whole assignment."""
        state = cls.empty(problem)
        for ch in choices:
            for grp, ranks in zip(ch.cand.groups, ch.ranks, strict=True):
                state.apply(grp, ranks)
        return state

    def copy(self) -> "LoadState":
        new = LoadState.__new__(LoadState)
        new.__dict__.update(self.__dict__)
        new.comp, new.comm = self.comp.copy(), self.comm.copy()
        new.hbm, new.ddr, new.ssd = self.hbm.copy(), self.ddr.copy(), self.ssd.copy()
        new.inter, new.rate = self.inter.copy(), self.rate.copy()
        return new

    def combine(self, comp: np.ndarray, comm: np.ndarray) -> np.ndarray:
        return step_time(comp, comm, self.pipelined)

    def deficit(self) -> np.ndarray:
        """(W, 3) owner-side bytes beyond each GPU's pieces' (placement.py); zeros where the
        owner side is not counted."""
        if not self.owner_side:
            return np.zeros((self.w, 3))
        return owner_deficit(self.inter, self.rate, self.host_of, self.model.batch_per_gpu)

    def wait_of(self, deficit: np.ndarray) -> np.ndarray:
        """Seconds of owner-side wait for deficits (..., 3)."""
        return wait_of(deficit, self.hw.eff_nic_bw)

    def wait(self) -> np.ndarray:
        """Per GPU, the owner side's seconds beyond the pieces' (placement-dependent)."""
        return self.wait_of(self.deficit())

    def wait_with(self, inter: np.ndarray) -> np.ndarray:
        """Per GPU, the owner-side wait if a piece with these inter-host bytes (3,) were added
        to it. Adding a piece to a host raises its pieces' total and the host's share alike,
        so the host's owner side stays as it is; the piece's own traffic fills its GPU's."""
        return self.wait_of(self.deficit() - inter[None, :])

    def load(self) -> np.ndarray:
        if not self.owner_side:  # no wait: comm + 0.0 is comm
            return self.combine(self.comp, self.comm)
        return self.combine(self.comp, self.comm + self.wait())

    def apply(self, group: Group, ranks: np.ndarray, sign: int = 1) -> None:
        if len(ranks) == 1 and (sign == 1 or sign == -1):
            # One piece (most groups): the same additions as np.add.at's, element by element
            # (a - x is a + (-x) exactly), without its per-call overhead.
            r = int(ranks[0])
            h = r // self.g
            if sign == 1:
                self.comp[r] += group.comp[0]
                self.comm[r] += group.comm[0]
                self.hbm[r] += group.hbm[0]
                self.ddr[h] += group.ddr[0]
                self.ssd[h] += group.ssd[0]
                self.inter[r] += group.inter[0]
                self.rate[h] += group.rate[0]
            else:
                self.comp[r] -= group.comp[0]
                self.comm[r] -= group.comm[0]
                self.hbm[r] -= group.hbm[0]
                self.ddr[h] -= group.ddr[0]
                self.ssd[h] -= group.ssd[0]
                self.inter[r] -= group.inter[0]
                self.rate[h] -= group.rate[0]
            return
        if (sign == 1 or sign == -1) and len(ranks) == self.w and ranks[0] == 0 and (
                np.array_equal(ranks, self._world)):
            # Piece i on rank i (data-parallel, row-wise): np.add.at's additions as whole-
            # array ones (each GPU gets one addition; a - x is a + (-x) exactly). Each host's
            # owner rates take its pieces one after another in rank order, as np.add.at adds
            # them (floats: the order is kept); bytes are integers, exact in any order.
            op = np.add if sign == 1 else np.subtract
            for mine, theirs in ((self.comp, group.comp), (self.comm, group.comm),
                                 (self.hbm, group.hbm), (self.inter, group.inter)):
                op(mine, theirs, out=mine)
            hosts = self.hw.hosts
            op(self.ddr, group.ddr.reshape(hosts, self.g).sum(axis=1), out=self.ddr)
            op(self.ssd, group.ssd.reshape(hosts, self.g).sum(axis=1), out=self.ssd)
            rate = group.rate.reshape(hosts, self.g, 3)
            for j in range(self.g):
                op(self.rate, rate[:, j], out=self.rate)
            return
        np.add.at(self.comp, ranks, sign * group.comp)
        np.add.at(self.comm, ranks, sign * group.comm)
        np.add.at(self.hbm, ranks, sign * group.hbm)
        hosts = self.host_of[ranks]
        np.add.at(self.ddr, hosts, sign * group.ddr)
        np.add.at(self.ssd, hosts, sign * group.ssd)
        np.add.at(self.inter, ranks, sign * group.inter)
        np.add.at(self.rate, hosts, sign * group.rate)

    # Choosing where a group goes: the placement that keeps the most loaded GPU it touches
    # lowest, among those that fit every cap; ties go to the lowest rank or host.
    def choose(self, group: Group, scope: Scope, allowed: np.ndarray | None) -> np.ndarray | None:
        if scope is Scope.GPU:
            return self._choose_gpu(group, allowed)
        if scope is Scope.WORLD:
            return self._choose_world(group)
        return self._choose_host(group, scope, allowed)

    def _choose_gpu(self, group: Group, allowed: np.ndarray | None) -> np.ndarray | None:
        hw = self.hw
        c, m = group.comp[0], group.comm[0]
        if self.owner_side:
            new = self.combine(self.comp + c, self.comm + m + self.wait_with(group.inter[0]))
        else:  # no wait: (comm + m) + 0.0 is comm + m
            new = self.combine(self.comp + c, self.comm + m)
        ok = self.hbm + group.hbm[0] <= hw.hbm_cap
        host_ok = (self.ddr + group.ddr[0] <= hw.ddr_cap) & (self.ssd + group.ssd[0] <= hw.ssd_cap)
        if not host_ok.all():
            ok &= host_ok[self.host_of]
        if allowed is not None:
            ok &= allowed
        if not ok.all():  # else the same GPU np.where(ok, new, inf) would give
            if not ok.any():
                return None
            new = np.where(ok, new, _INF)
        best = int(np.argmin(new))
        if self.spread_hosts:
            best = self._least_loaded_host_first(new, best)
        return np.array([best])

    def _least_loaded_host_first(self, new: np.ndarray, best: int) -> int:
        """Among the GPUs whose load `new` equals the least (an empty cluster), the one on
        the least loaded host: the largest pieces spread over the hosts instead of filling
        host 0, whose GPUs would then send too small a share of the outputs and wait on the
        owner side of the all-to-alls (hugectr_200 x 4 hosts: 36.29 -> 35.36 ms; worse on
        some 16-host cases, so pipeline.best_start keeps the better of the two)."""
        tied = np.flatnonzero(new == new[best])
        if len(tied) < 2:
            return best
        host_load = np.bincount(self.host_of, weights=self.comp + self.comm,
                                minlength=self.hw.hosts)
        return int(tied[np.argmin(host_load[self.host_of[tied]])])

    def _choose_world(self, group: Group) -> np.ndarray | None:
        hw = self.hw
        if (self.hbm + group.hbm > hw.hbm_cap).any():
            return None
        if (self.ddr + group.ddr.reshape(hw.hosts, -1).sum(axis=1) > hw.ddr_cap).any():
            return None
        if (self.ssd + group.ssd.reshape(hw.hosts, -1).sum(axis=1) > hw.ssd_cap).any():
            return None
        return np.arange(self.w)

    def _choose_host(self, group: Group, scope: Scope,
                     allowed: np.ndarray | None) -> np.ndarray | None:
        hw, g, k = self.hw, self.g, len(group)
        comp = self.comp.reshape(hw.hosts, g)
        comm = self.comm.reshape(hw.hosts, g)
        hbm = self.hbm.reshape(hw.hosts, g)
        if scope is Scope.HOST_FIXED:
            # Piece j on each host's j-th GPU: the per-host arrays as they are.
            new = self.combine(comp + group.comp, comm + group.comm)
            ok = (hbm + group.hbm <= hw.hbm_cap).all(axis=1)
            if allowed is not None:
                ok &= allowed.reshape(hw.hosts, g).all(axis=1)
            local = None
        else:
            # Distinct GPUs of the host: the biggest piece onto the least loaded GPU, among
            # the GPUs the table's pins allow (a host with fewer than k of them is refused
            # below).
            busy = self.combine(comp, comm)
            if allowed is not None:
                busy = np.where(allowed.reshape(hw.hosts, g), busy, _INF)
            order = np.argsort(busy, axis=1, kind="stable")[:, :k]
            local = order[:, np.argsort(-(group.comp + group.comm), kind="stable").argsort()]
            rows = np.arange(hw.hosts)[:, None]
            new = self.combine(comp[rows, local] + group.comp, comm[rows, local] + group.comm)
            ok = (hbm[rows, local] + group.hbm <= hw.hbm_cap).all(axis=1)
            if allowed is not None:
                ok &= allowed.reshape(hw.hosts, g)[rows, local].all(axis=1)
        host_max = new.max(axis=1)
        ok &= self.ddr + int(group.ddr.sum()) <= hw.ddr_cap
        ok &= self.ssd + int(group.ssd.sum()) <= hw.ssd_cap
        if not ok.any():
            return None
        h = int(np.argmin(np.where(ok, host_max, _INF)))
        if local is None:
            return h * g + np.arange(g)
        return h * g + local[h]

    def place(self, cand: Candidate, allowed: np.ndarray | None) -> list[np.ndarray] | None:
        """Place every group of `cand` in turn (applied to self); None if one does not fit."""
        placed: list[np.ndarray] = []
        for grp in cand.groups:
            ranks = self.choose(grp, cand.scope, allowed)
            if ranks is None:
                return None
            self.apply(grp, ranks)
            placed.append(ranks)
        return placed

    def shortfall(self, cand: Candidate, allowed: np.ndarray | None) -> Shortfall:
        """The tightest cap for the candidate's largest piece, against the most free space."""
        hw = self.hw
        pool = np.ones(self.w, dtype=bool) if allowed is None else allowed
        free_hbm = int((hw.hbm_cap - self.hbm)[pool].max())
        free_ddr = int((hw.ddr_cap - self.ddr).max())
        free_ssd = int((hw.ssd_cap - self.ssd).max())
        per_host = cand.scope in (Scope.HOST_FIXED, Scope.HOST_FREE)
        need_ddr = max(int(g.ddr.sum()) if per_host else int(g.ddr.max()) for g in cand.groups)
        need_ssd = max(int(g.ssd.sum()) if per_host else int(g.ssd.max()) for g in cand.groups)
        options = [
            Shortfall("HBM per GPU", cand.max_piece_hbm, free_hbm),
            Shortfall("DDR per host", need_ddr, free_ddr),
            Shortfall("SSD per host", need_ssd, free_ssd),
        ]
        return max(options, key=lambda s: s.need - s.free)
