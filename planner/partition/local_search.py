"""Local search after the greedy: move, swap and re-shard pieces off the slowest GPU.

Each accepted step lowers the slowest GPU's load and leaves every GPU it touches below the
old maximum, so (makespan, number of GPUs at the makespan) falls strictly and the search
ends. The budget is a count of steps, not seconds, so the same input gives the same plan.

Moves: a table-wise or column-wise piece from the slowest GPU to the GPU where it ends
lowest. Swaps: such a piece for a cheaper one elsewhere. Re-shards: take a table with a piece
on the slowest GPU out entirely and put it back with whichever of its candidates (another
sharding, split or tier, or the same one on other GPUs or another host) leaves the touched
GPUs lowest. Pulls (several hosts): when the slowest GPU waits on the owner side of the
all-to-alls (its host holds too small a share of the pieces' outputs), a piece from another
host onto a GPU of the slowest GPU's host, which shrinks that host's owner side on every GPU.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner.candidates import Candidate, Scope
from planner.partition.assignment import Assignment, TableChoice
from planner.partition.greedy import allowed_mask
from planner.partition.state import LoadState
from planner.problem import Problem

log = logging.getLogger("planner.local_search")

# Tables tried for a re-shard per step, the most expensive on the slowest GPU first.
_RESHARD_TABLES = 6
# Pulls tried per step: the pieces on other hosts that fill most of the slowest GPU's owner
# deficit, each onto the least loaded GPUs of its host that fit.
_PULL_PIECES, _PULL_TARGETS = 16, 4
_REL_EPS = 1e-9
# _move_screen: pieces whose vectorized value lies within this (relative) of the least are
# valued exactly; at most this many cells (pieces x GPUs x 3) per vectorized block.
_SCREEN_TOL = 1e-9
_SCREEN_CELLS = 1 << 21


@dataclass
class SearchStats:
    moves: int = 0
    swaps: int = 0
    reshards: int = 0
    pulls: int = 0
    steps: int = 0
    exhausted: bool = False  # stopped by the step budget, not at a local optimum


class _Pieces:
    """Flat arrays over the movable (GPU-scope) pieces, for vectorized move and swap tests."""

    def __init__(self, choices: list[TableChoice]) -> None:
        refs: list[tuple[int, int]] = []
        for t, ch in enumerate(choices):
            if ch.cand.scope is Scope.GPU:
                refs.extend((t, gi) for gi in range(len(ch.cand.groups)))
        self.refs = refs
        groups = [choices[t].cand.groups[gi] for t, gi in refs]
        self.table = np.array([t for t, _ in refs], dtype=np.int64)
        self.rank = np.array([int(choices[t].ranks[gi][0]) for t, gi in refs], dtype=np.int64)
        self.comp = np.array([g.comp[0] for g in groups])
        self.comm = np.array([g.comm[0] for g in groups])
        self.hbm = np.array([g.hbm[0] for g in groups], dtype=np.int64)
        self.ddr = np.array([g.ddr[0] for g in groups], dtype=np.int64)
        self.ssd = np.array([g.ssd[0] for g in groups], dtype=np.int64)
        self.inter = np.array([g.inter[0] for g in groups]).reshape(-1, 3)


class LocalSearch:
    def __init__(self, problem: Problem, cands: list[list[Candidate]],
                 assignment: Assignment) -> None:
        self.p = problem
        self.cands = cands
        # Its own lists, so the caller's assignment stays as given (moves replace a group's
        # ranks array and never write into one).
        self.choices = [TableChoice(ch.cand, list(ch.ranks)) for ch in assignment.choices]
        self.assignment = assignment
        self.state = LoadState.of_choices(problem, self.choices)
        self.masks = [allowed_mask(problem, t) for t in range(len(problem.tables))]
        self.pinned = np.array([m is not None for m in self.masks], dtype=bool)
        self.pieces = _Pieces(self.choices)
        self.stats = SearchStats()

    def run(self, max_steps: int) -> Assignment:
        while self.stats.steps < max_steps:
            load = self.state.load()
            s = int(np.argmax(load))
            ms = float(load[s])
            limit = ms - _REL_EPS * max(ms, 1e-30)
            if not (self._verified(self._move, s, load, limit)
                    or self._verified(self._swap, s, load, limit)
                    or self._reshard(s, load, limit)
                    or self._verified(self._pull, s, load, limit)):
                break
            self.stats.steps += 1
        else:
            self.stats.exhausted = True
        st = self.stats
        log.info("local search: %d moves, %d swaps, %d re-shards, %d pulls%s", st.moves,
                 st.swaps, st.reshards, st.pulls, " (step budget spent)" if st.exhausted else "")
        status = "stopped at step limit" if st.exhausted else "local optimum"
        notes = [*self.assignment.notes,
                 f"local search: {st.moves} moves, {st.swaps} swaps, {st.reshards} re-shards"
                 + (f", {st.pulls} pulls" if st.pulls else "")]
        start = self.assignment.solver
        solver = start if start.endswith("+local_search") else f"{start}+local_search"
        return Assignment(choices=self.choices, solver=solver, status=status, notes=notes)

    def _verified(self, step: Callable[[int, float], list[tuple[int, int]]], s: int,
                  load: np.ndarray, limit: float) -> bool:
        """Run a move or swap, chosen on the pieces' own loads, then keep it only if the true
        loads (with the owner side of the all-to-alls, which moves with the hosts' shares)
        agree: every GPU it changed ends below the old makespan. Otherwise undo it."""
        done = step(s, limit)
        if not done:
            return False
        new = self.state.load()
        changed = new != load
        if new[s] < limit and (new[changed] < limit).all():
            return True
        for i, src in reversed(done):
            self._relocate(i, src)
        if step == self._move:
            self.stats.moves -= 1
        elif step == self._swap:
            self.stats.swaps -= 1
        else:
            self.stats.pulls -= 1
        return False

    def _fits(self, idx: np.ndarray | int, dst: np.ndarray, remove_rank: np.ndarray | None = None,
              add_idx: np.ndarray | None = None) -> np.ndarray:
        """Memory check for pieces `idx` landing on ranks `dst` (optionally minus others)."""
        hw, st, pc = self.p.hw, self.state, self.pieces
        src_host = st.host_of[pc.rank[idx]]
        dst_host = st.host_of[dst]
        other = add_idx
        hbm = st.hbm[dst] + pc.hbm[idx] - (pc.hbm[other] if other is not None else 0)
        cross = dst_host != src_host
        ddr_delta = pc.ddr[idx] - (pc.ddr[other] if other is not None else 0)
        ssd_delta = pc.ssd[idx] - (pc.ssd[other] if other is not None else 0)
        ok = hbm <= hw.hbm_cap
        ok &= ~cross | (st.ddr[dst_host] + ddr_delta <= hw.ddr_cap)
        ok &= ~cross | (st.ssd[dst_host] + ssd_delta <= hw.ssd_cap)
        return ok

    def _move(self, s: int, limit: float) -> list[tuple[int, int]]:
        st, pc = self.state, self.pieces
        on_s = np.flatnonzero(pc.rank == s)
        best: tuple[float, int, int] | None = None
        deficit = st.deficit()
        if len(on_s) > 1:
            on_s = self._move_screen(s, on_s, deficit, limit)
        for i in on_s:
            # s loses the piece's own inter-host bytes, so its owner-side wait can grow.
            new_s = float(st.combine(st.comp[s] - pc.comp[i], st.comm[s] - pc.comm[i]
                                     + st.wait_of(deficit[s] + pc.inter[i])))
            # st.wait_with(inter), with the deficit computed once for all pieces.
            new = st.combine(st.comp + pc.comp[i],
                             st.comm + pc.comm[i] + st.wait_of(deficit - pc.inter[i][None, :]))
            dst = np.arange(st.w)
            ok = self._fits(int(i), dst) & (dst != s)
            mask = self.masks[pc.table[i]]
            if mask is not None:
                ok &= mask
            if not ok.any():
                continue
            g = int(np.argmin(np.where(ok, new, np.inf)))
            val = max(new_s, float(new[g]))
            if val < limit and (best is None or val < best[0]):
                best = (val, int(i), g)
        if best is None:
            return []
        _, i, g = best
        self._relocate(i, g)
        self.stats.moves += 1
        return [(i, s)]

    def _move_screen(self, s: int, on_s: np.ndarray, deficit: np.ndarray,
                     limit: float) -> np.ndarray:
        """The pieces of `on_s` (in their order) whose move could be the best: each piece's
        move valued for all pieces at once, as _move values it one piece at a time, and
        those within _SCREEN_TOL of the least kept. Only the order of a few additions can
        differ from _move's (~1e-16 relative), so the best piece and every piece tied with
        it stay, and _move's exact loop over them picks what it would pick over all."""
        st, pc, hw = self.state, self.pieces, self.p.hw
        cross = st.host_of != st.host_of[s]  # every piece here sits on s's host
        ddr, ssd = st.ddr[st.host_of], st.ssd[st.host_of]
        vals = np.empty(len(on_s))
        step = max(1, _SCREEN_CELLS // (3 * st.w))
        for lo in range(0, len(on_s), step):
            idx = on_s[lo:lo + step]
            comp, comm, inter = pc.comp[idx], pc.comm[idx], pc.inter[idx]
            new_s = st.combine(st.comp[s] - comp, st.comm[s] - comm
                               + st.wait_of(deficit[s][None, :] + inter))
            new = st.combine(st.comp[None, :] + comp[:, None],
                             st.comm[None, :] + comm[:, None]
                             + st.wait_of(deficit[None, :, :] - inter[:, None, :]))
            ok = st.hbm[None, :] + pc.hbm[idx][:, None] <= hw.hbm_cap
            ok &= ~cross[None, :] | (ddr[None, :] + pc.ddr[idx][:, None] <= hw.ddr_cap)
            ok &= ~cross[None, :] | (ssd[None, :] + pc.ssd[idx][:, None] <= hw.ssd_cap)
            ok[:, s] = False
            for row, i in enumerate(idx.tolist()):
                mask = self.masks[pc.table[i]]
                if mask is not None:
                    ok[row] &= mask
            vals[lo:lo + step] = np.maximum(new_s, np.where(ok, new, np.inf).min(axis=1))
        finite = np.isfinite(vals)
        if not finite.any():
            return on_s[:0]
        least = float(vals[finite].min())
        return on_s[finite & (vals <= least + _SCREEN_TOL * (abs(least) + abs(limit)))]

    def _swap(self, s: int, limit: float) -> list[tuple[int, int]]:
        st, pc = self.state, self.pieces
        on_s = np.flatnonzero(pc.rank == s)
        others = np.flatnonzero(pc.rank != s)
        if len(on_s) == 0 or len(others) == 0:
            return []
        rb = pc.rank[others]
        best: tuple[float, int, int] | None = None
        deficit = st.deficit()
        # What does not depend on a, gathered once (the same values, added in the same
        # order; byte counts are integers, exact in any order).
        hw = self.p.hw
        inter_o, comp_o, comm_o = pc.inter[others], pc.comp[others], pc.comm[others]
        comp_rb_o, comm_rb_o = st.comp[rb] - comp_o, st.comm[rb] - comm_o
        deficit_s, deficit_rb = deficit[s], deficit[rb]
        host_s = int(st.host_of[s])
        host_rb = st.host_of[rb]
        same_host = host_rb == host_s
        hbm_o, ddr_o, ssd_o = pc.hbm[others], pc.ddr[others], pc.ssd[others]
        hbm_rb_o = st.hbm[rb] - hbm_o
        ddr_rb, ssd_rb = st.ddr[host_rb], st.ssd[host_rb]
        hbm_s_o = st.hbm[s] + hbm_o
        ddr_s, ssd_s = int(st.ddr[host_s]), int(st.ssd[host_s])
        # Pieces whose table is pinned: only they can be refused rank s by their pins.
        pinned_o = np.flatnonzero(self.pinned[pc.table[others]]).tolist()
        for a in on_s:
            # Each side's owner-side wait with the pieces' inter-host bytes exchanged (the
            # hosts' shares move too when the swap crosses hosts; _verified checks that).
            d_in = inter_o - pc.inter[a]
            new_s = st.combine(st.comp[s] - pc.comp[a] + comp_o,
                               st.comm[s] - pc.comm[a] + comm_o
                               + st.wait_of(deficit_s - d_in))
            new_g = st.combine(comp_rb_o + pc.comp[a],
                               comm_rb_o + pc.comm[a]
                               + st.wait_of(deficit_rb + d_in))
            val = np.maximum(new_s, new_g)
            ok = val < limit
            if not ok.any():
                continue
            # a moves to b's rank (b gone), b to s (a gone): HBM on both GPUs, DDR and SSD on
            # both hosts when they differ (as _fits checks them).
            ha, da, sa = int(pc.hbm[a]), int(pc.ddr[a]), int(pc.ssd[a])
            ok &= hbm_rb_o + ha <= hw.hbm_cap
            ok &= same_host | (ddr_rb + (da - ddr_o) <= hw.ddr_cap)
            ok &= same_host | (ssd_rb + (sa - ssd_o) <= hw.ssd_cap)
            ok &= hbm_s_o - ha <= hw.hbm_cap
            ok &= same_host | (ddr_s + (ddr_o - da) <= hw.ddr_cap)
            ok &= same_host | (ssd_s + (ssd_o - sa) <= hw.ssd_cap)
            ma = self.masks[pc.table[a]]
            if ma is not None:
                ok &= ma[rb]
            for j in pinned_o:
                if ok[j] and not self.masks[pc.table[others[j]]][s]:
                    ok[j] = False
            if not ok.any():
                continue
            j = int(np.argmin(np.where(ok, val, np.inf)))
            if best is None or val[j] < best[0]:
                best = (float(val[j]), int(a), int(others[j]))
        if best is None:
            return []
        _, a, b = best
        ra, rb_ = int(pc.rank[a]), int(pc.rank[b])
        self._relocate(a, rb_)
        self._relocate(b, ra)
        self.stats.swaps += 1
        return [(a, ra), (b, rb_)]

    def _pull(self, s: int, limit: float) -> list[tuple[int, int]]:
        """The piece from another host that, moved onto a GPU of s's host, leaves the GPUs it
        changes lowest; tried exactly (owner side included) on the pieces whose inter-host
        bytes best fill s's owner deficit."""
        st, pc = self.state, self.pieces
        deficit = st.deficit()[s]
        if not st.owner_side or (deficit <= 0).all():
            return []
        h = int(st.host_of[s])
        away = np.flatnonzero(st.host_of[pc.rank] != h)
        if len(away) == 0:
            return []
        fill = np.minimum(pc.inter[away], np.maximum(deficit, 0.0)[None, :]).sum(axis=1)
        order = away[np.lexsort((away, -fill))][:_PULL_PIECES]
        host_ranks = np.flatnonzero(st.host_of == h)
        before = st.load()
        best: tuple[float, int, int] | None = None
        for i in order:
            if fill[np.searchsorted(away, i)] <= 0:
                break
            ok = self._fits(int(i), host_ranks)
            mask = self.masks[pc.table[i]]
            if mask is not None:
                ok &= mask[host_ranks]
            dsts = host_ranks[ok]
            dsts = dsts[np.argsort(before[dsts], kind="stable")][:_PULL_TARGETS]
            src = int(pc.rank[i])
            for g in dsts:
                self._relocate(int(i), int(g))
                new = st.load()
                self._relocate(int(i), src)
                changed = new != before
                worst = float(new[changed].max()) if changed.any() else float(before.max())
                if new[s] < limit and worst < limit and (best is None or worst < best[0]):
                    best = (worst, int(i), int(g))
        if best is None:
            return []
        _, i, g = best
        src = int(pc.rank[i])
        self._relocate(i, g)
        self.stats.pulls += 1
        return [(i, src)]

    def _relocate(self, i: int, dst: int) -> None:
        pc = self.pieces
        t, gi = pc.refs[i]
        ch = self.choices[t]
        grp = ch.cand.groups[gi]
        self.state.apply(grp, ch.ranks[gi], -1)
        ch.ranks[gi] = np.array([dst])
        self.state.apply(grp, ch.ranks[gi], +1)
        pc.rank[i] = dst

    def _reshard(self, s: int, load: np.ndarray, limit: float) -> bool:
        st = self.state
        on_s: list[tuple[float, int]] = []
        for t, ch in enumerate(self.choices):
            cost = 0.0
            for grp, ranks in zip(ch.cand.groups, ch.ranks, strict=True):
                hit = ranks == s
                if hit.any():
                    cost += float(st.combine(grp.comp[hit], grp.comm[hit]).sum())
            if cost > 0:
                on_s.append((-cost, t))
        for _, t in sorted(on_s)[:_RESHARD_TABLES]:
            ch = self.choices[t]
            for grp, ranks in zip(ch.cand.groups, ch.ranks, strict=True):
                st.apply(grp, ranks, -1)
            best: tuple[float, LoadState, TableChoice] | None = None
            for cand in self.cands[t]:
                trial = st.copy()
                ranks = trial.place(cand, self.masks[t])
                if ranks is None:
                    continue
                new = trial.load()
                changed = new != load
                worst = float(new[changed].max()) if changed.any() else float(load.max())
                if new[s] < limit and worst < limit and (best is None or worst < best[0]):
                    best = (worst, trial, TableChoice(cand, ranks))
            if best is None:
                for grp, ranks in zip(ch.cand.groups, ch.ranks, strict=True):
                    st.apply(grp, ranks, +1)
                continue
            self.state = best[1]
            self.choices[t] = best[2]
            self.pieces = _Pieces(self.choices)
            self.stats.reshards += 1
            return True
        return False


def local_search(problem: Problem, cands: list[list[Candidate]], assignment: Assignment,
                 max_steps: int) -> Assignment:
    return LocalSearch(problem, cands, assignment).run(max_steps)
