"""Solving off the event loop, with the queue in the store.

A POST queues a job in the store (the queue limit is counted there, atomically, so it holds
across replicas). Each server instance runs a dispatcher that claims queued jobs while it has
a free solver, each with a lease (instance id, expiry) that a keeper task renews while the
job solves; a replica takes over a job only after its lease has expired, and writes a result
only while it holds the lease (a fenced write). A cancel (DELETE) or a lost lease stops the
local solve, which stops its process. `plan()` runs in a process pool (pebble) with a
per-task time limit; /v1/check and /v1/evaluate have a pool of their own, so a cheap call
never waits behind a long solve. The event loop only schedules work and awaits futures.
"""

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import multiprocessing
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import IO, Any

from pebble import ProcessExpired, ProcessPool

from api import worker
from api.metrics import Metrics
from api.problems import (
    BAD_INPUT,
    CANCELLED,
    INFEASIBLE,
    SOLVE_FAILED,
    Problem,
    no_plan_found,
)
from api.settings import ServiceSettings
from api.store import UNFINISHED, JobRow, QueueFull, SolverQuota, Store

log = logging.getLogger("planner.service")

_RESPAWN_AFTER_S = 1.0
# A solver killed by SIGTERM/SIGINT usually means this server is stopping: claim nothing
# for this long, so the job goes to another replica (or the next start), not back here.
_PAUSE_AFTER_INTERRUPT_S = 5.0
_WATCH_POLL_S = 0.1


class Busy(Exception):
    """Too many jobs are waiting for a solver."""


class Interrupted(Exception):
    """The solver process was stopped by a signal (the server stopping): re-run, not failed."""


class SolveFailed(Exception):
    """The pool could not give an outcome: time limit, a dead worker, or a planner bug."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.detail)
        self.problem = problem


def problem_of(outcome: worker.Outcome, job_id: str | None = None) -> Problem:
    """The problem a worker's bad_input or infeasible outcome stands for."""
    if outcome["status"] == "bad_input":
        return Problem(type=BAD_INPUT, title="Bad input", status=422, detail=outcome["message"],
                       field=outcome["field"], table=outcome["table"], job_id=job_id)
    if outcome["status"] == "no_plan_found":
        return no_plan_found(outcome["reason"], job_id)
    return Problem(type=INFEASIBLE, title="No plan fits", status=422, detail=outcome["reason"],
                   table=outcome["table"], cap=outcome["cap"],
                   short_bytes=outcome["short_bytes"], certificate=outcome.get("certificate"),
                   job_id=job_id)


def cancelled_problem(job_id: str) -> Problem:
    return Problem(type=CANCELLED, title="Cancelled", status=409,
                   detail="the job was cancelled on request (POST it again to re-run it)",
                   job_id=job_id)


@dataclass
class _Held:
    fence: int
    task: asyncio.Task[None]
    lost: bool = False  # the lease is gone (cancelled, or taken over): write nothing
    # Its result is being written: the fenced write settles it, so no lease renewal may cancel
    # it (a renewal that ran while the write committed saw the job no longer running, took
    # that for a lost lease and cancelled the task between the commit and its audit line).
    finishing: bool = False


class JobRunner:
    def __init__(self, settings: ServiceSettings, store: Store, metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.instance = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self._pool: ProcessPool | None = None
        self._tool_pool: ProcessPool | None = None
        self._tool_slots = asyncio.Semaphore(settings.tool_workers)
        self._tool_waiting = 0
        self._held: dict[str, _Held] = {}
        self._wake = asyncio.Event()
        self._watchers: dict[str, list[asyncio.Future[None]]] = {}
        self._watch_wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._warm: asyncio.Future[Any] | None = None
        self._paused_until = 0.0
        self._stopping = False
        # Lease renewal gets a thread of its own: never queued behind request handlers.
        self._lease_thread = concurrent.futures.ThreadPoolExecutor(1, "planner-lease")
        self._audit_file: IO[str] | None = None

    # Life cycle
    @staticmethod
    def _new_pool(workers: int) -> ProcessPool:
        # spawn, not fork: the server process has threads (the store, the loop's executor).
        return ProcessPool(max_workers=workers, initializer=worker.warm_up,
                           context=multiprocessing.get_context("spawn"))

    async def start(self) -> None:
        if self.settings.audit_log is not None:
            self._audit_file = open(self.settings.audit_log, "a", buffering=1)  # noqa: SIM115
        self._pool = self._new_pool(self.settings.max_concurrent_solves)
        self._tool_pool = self._new_pool(self.settings.tool_workers)
        # Start the workers now (imports take seconds), so the first request does not wait.
        self._warm = asyncio.gather(*(
            asyncio.wrap_future(pool.schedule(worker.warm_up))
            for pool, n in ((self._pool, self.settings.max_concurrent_solves),
                            (self._tool_pool, self.settings.tool_workers))
            for _ in range(n)), return_exceptions=True)
        # One claim before serving: jobs a stopped server gave back are re-run (or failed,
        # after max_attempts starts) before anyone can look at them.
        await self._claim()
        self._tasks = [asyncio.create_task(self._dispatch()),
                       asyncio.create_task(self._keep_leases()),
                       asyncio.create_task(self._watch())]
        # Retention, and dropping solver usage older than any quota window.
        self._tasks.append(asyncio.create_task(self._cleanup()))

    async def stop(self) -> None:
        """Give the jobs held here back to the queue: another replica, or the next start,
        runs them at once (no lease to wait out)."""
        self._stopping = True
        held = [h.task for h in self._held.values()]
        tasks = [t for t in (*self._tasks, self._warm, *held) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for pool in (self._pool, self._tool_pool):
            if pool is not None:
                pool.stop()
                await asyncio.to_thread(pool.join, 10)
        self._lease_thread.shutdown(wait=False)
        if self._audit_file is not None:
            self._audit_file.close()

    @property
    def ready(self) -> bool:
        """The pools run and their workers have started (imported the planner)."""
        return (self._pool is not None and self._pool.active and self._tool_pool is not None
                and self._tool_pool.active and self._warm is not None and self._warm.done())

    @property
    def solvers_busy(self) -> int:
        return len(self._held)

    def _audit(self, event: str, job_id: str, fence: int, **extra: Any) -> None:
        if self._audit_file is not None:
            self._audit_file.write(json.dumps({"t": time.time(), "instance": self.instance,
                                               "event": event, "job": job_id, "fence": fence,
                                               **extra}) + "\n")

    # The queue
    async def submit(self, job_id: str, request_json: str, tables: int, time_limit_s: float,
                     client: str | None = None, client_max_unfinished: int | None = None,
                     client_solver_quota: SolverQuota | None = None,
                     ) -> tuple[JobRow, bool]:
        """The job for this request: the stored one, or a new one queued (created=True).
        Busy when the queue is full; store.OverQuota when one of the client's quotas is."""
        try:
            row, created = await asyncio.to_thread(
                self.store.submit, job_id, request_json, tables, time_limit_s,
                self.settings.max_queued_jobs, client, client_max_unfinished,
                client_solver_quota)
        except QueueFull:
            raise Busy from None
        if created:
            self._wake.set()
        return row, created

    async def cancel(self, job_id: str) -> tuple[JobRow | None, bool]:
        """Cancel a queued or running job. A solve running here stops now; one running on
        another replica stops when that replica next renews its lease."""
        error = cancelled_problem(job_id).model_dump_json(exclude_none=True)
        row, cancelled = await asyncio.to_thread(self.store.cancel, job_id, error)
        held = self._held.get(job_id)
        if cancelled and held is not None:
            held.lost = True
            held.task.cancel()
        if cancelled:
            self.metrics.jobs.labels("cancelled").inc()
            self._notify(job_id)
        return row, cancelled

    def _interrupted_error(self, row: JobRow) -> str:
        return Problem(type=SOLVE_FAILED, title="Interrupted", status=503,
                       detail=f"the server stopped during this job {row.attempts} times; it "
                              "is not re-run again (POST it to retry)",
                       job_id=row.id).model_dump_json(exclude_none=True)

    async def _claim(self) -> bool:
        free = self.settings.max_concurrent_solves - len(self._held)
        if free <= 0 or self._stopping or time.monotonic() < self._paused_until:
            return False
        claimed, failed = await asyncio.to_thread(
            self.store.claim, self.instance, self.settings.lease_ttl_s, free,
            self.settings.max_attempts, self._interrupted_error)
        for row in failed:
            self.metrics.jobs.labels("failed").inc()
            log.warning("job %s failed: interrupted %d times", row.id, row.attempts)
            self._audit("failed_attempts", row.id, row.fence)
            self._notify(row.id)
        for row in claimed:
            self.metrics.jobs_claimed.inc()
            self._audit("claim", row.id, row.fence, attempts=row.attempts)
            if row.attempts > 1 and row.note:
                log.warning("job %s: %s", row.id, row.note)
            task = asyncio.create_task(self._run(row))
            self._held[row.id] = _Held(fence=row.fence, task=task)
        return bool(claimed or failed)

    async def _dispatch(self) -> None:
        while True:
            self._wake.clear()
            try:
                if await self._claim():
                    continue
            except Exception:  # the store is down: retry at the next poll
                log.exception("claiming jobs failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.claim_poll_s)

    async def _keep_leases(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.settings.lease_renew_s)
            leases = {i: h.fence for i, h in self._held.items()
                      if not h.lost and not h.finishing}
            if not leases:
                continue
            try:
                kept = await loop.run_in_executor(
                    self._lease_thread, self.store.renew, self.instance,
                    self.settings.lease_ttl_s, leases)
            except Exception:  # keep trying; a lease outlives a few failed renewals
                log.exception("renewing leases failed")
                continue
            for job_id in leases.keys() - kept:
                held = self._held.get(job_id)
                if held is None or held.fence != leases[job_id] or held.finishing:
                    continue
                held.lost = True
                held.task.cancel()
                self.metrics.leases_lost.inc()
                self._audit("lease_lost", job_id, held.fence)
                log.warning("job %s: lease lost (cancelled, or taken over); its solve stops",
                            job_id)

    async def _cleanup(self) -> None:
        """Retention and old solver usage, on every replica (the deletes are idempotent)."""
        s = self.settings
        while True:
            try:
                deleted = await asyncio.to_thread(
                    self.store.cleanup, s.retention_days * 86400 if s.retention_days else None,
                    s.max_plans or None, usage_older_than_s=s.solver_usage_keep_s)
                if deleted:
                    log.info("retention: %d finished job(s) deleted", deleted)
            except Exception:
                log.exception("retention cleanup failed")
            await asyncio.sleep(s.cleanup_every_s)

    # Waiting for a job (POST's synchronous answer)
    def _notify(self, job_id: str) -> None:
        for fut in self._watchers.pop(job_id, []):
            if not fut.done():
                fut.set_result(None)

    async def _watch(self) -> None:
        """Jobs finished by other replicas: one query for every job waited on here."""
        while True:
            if not self._watchers:
                self._watch_wake.clear()
                await self._watch_wake.wait()
            try:
                statuses = await asyncio.to_thread(self.store.statuses, list(self._watchers))
            except Exception:
                log.exception("watching jobs failed")
                statuses = {}
            for job_id, status in statuses.items():
                if status not in UNFINISHED:
                    self._notify(job_id)
            await asyncio.sleep(_WATCH_POLL_S)

    async def wait(self, job_id: str, timeout_s: float) -> JobRow | None:
        """The job once finished, or as it stands after timeout_s."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watchers.setdefault(job_id, []).append(fut)
        self._watch_wake.set()
        try:
            row = await asyncio.to_thread(self.store.get_job, job_id)
            if row is not None and row.status in UNFINISHED:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(fut, timeout_s)
                row = await asyncio.to_thread(self.store.get_job, job_id)
        finally:
            waiting = self._watchers.get(job_id)
            if waiting is not None and fut in waiting:
                waiting.remove(fut)
                if not waiting:
                    del self._watchers[job_id]
        return row

    # Solving
    async def _in_pool(self, pool: ProcessPool | None, fn: Callable[[str], worker.Outcome],
                       arg: str, timeout_s: float) -> worker.Outcome:
        assert pool is not None
        self.metrics.solves_running.inc()
        start = time.perf_counter()
        future = pool.schedule(fn, (arg,), timeout=timeout_s)
        try:
            # Cancelling the wrapper cancels the pebble future, which stops its process.
            return await asyncio.wrap_future(future)
        except TimeoutError:
            raise SolveFailed(Problem(
                type=SOLVE_FAILED, title="Solve ran past its time limit", status=422,
                detail=f"the solve did not finish within {timeout_s:g} s (options."
                       "time_limit_s plus the service's overhead allowance)")) from None
        except BrokenProcessPool:
            # pebble gives up on a pool when a worker dies with no task of its own (e.g. just
            # after a timed-out task's worker was stopped): a new pool takes the next task,
            # and this one is re-run (a solve) or answered 503 (a tool call).
            log.warning("a process pool broke; replacing it")
            raise Interrupted from None
        except ProcessExpired as exc:
            # pebble's worker exits with the signal's number, multiprocessing with minus it.
            if abs(exc.exitcode or 0) in (signal.SIGTERM, signal.SIGINT):
                raise Interrupted from None
            raise SolveFailed(Problem(
                type=SOLVE_FAILED, title="Solver process died", status=500,
                detail=f"the solver process died (exit code {exc.exitcode}); the request "
                       "may need more memory than a worker has")) from None
        finally:
            self.metrics.solves_running.dec()
            self.metrics.solve_seconds.observe(time.perf_counter() - start)

    def _renewed(self, pool: ProcessPool | None, workers: int) -> ProcessPool:
        """The pool, or a new one in its place when pebble has marked it broken."""
        if pool is not None and (pool.active or self._stopping):
            return pool
        log.warning("process pool broken: starting a new one with %d worker(s)", workers)
        if pool is not None:
            pool.stop()  # its workers are gone or going; join happens in the background
        return self._new_pool(workers)

    async def call(self, fn: Callable[[str], worker.Outcome], arg: str,
                   timeout_s: float) -> worker.Outcome:
        """Run fn(arg) in the tools' pool (check, evaluate); Busy if too many wait."""
        if self._tool_waiting >= self.settings.max_queued_jobs:
            raise Busy
        self._tool_waiting += 1
        try:
            await self._tool_slots.acquire()
        finally:
            self._tool_waiting -= 1
        try:
            self._tool_pool = self._renewed(self._tool_pool, self.settings.tool_workers)
            return await self._in_pool(self._tool_pool, fn, arg, timeout_s)
        finally:
            self._tool_slots.release()

    async def _record_usage(self, row: JobRow, seconds: float) -> None:
        """Charge a solve attempt's wall time to the key that asked for the job (its solver
        seconds quota); never fails the job."""
        if row.client is None:
            return
        try:
            await asyncio.shield(asyncio.to_thread(
                self.store.record_usage, row.client, row.id, row.fence, seconds))
        except (Exception, asyncio.CancelledError):
            log.exception("job %s: recording %.2f solver seconds failed", row.id, seconds)

    async def _run(self, row: JobRow) -> None:
        started = time.monotonic()
        try:
            await self._run_job(row)
        finally:
            await self._record_usage(row, time.monotonic() - started)

    async def _run_job(self, row: JobRow) -> None:
        job_id, fence = row.id, row.fence
        fields: dict[str, Any]
        try:
            try:
                self._pool = self._renewed(self._pool, self.settings.max_concurrent_solves)
                outcome = await self._in_pool(self._pool, worker.solve, row.request,
                                              self.settings.solve_deadline_s(row.time_limit_s))
                status = str(outcome["status"])
                if status == "succeeded":
                    fields = {"plan": outcome["plan"], "plan_hash": outcome["plan_hash"]}
                else:
                    fields = {"error": problem_of(outcome, job_id).model_dump_json(
                        exclude_none=True)}
            except Interrupted:
                self._paused_until = time.monotonic() + _PAUSE_AFTER_INTERRUPT_S
                # Later, so a server that is stopping cancels this first (same outcome).
                await asyncio.sleep(_RESPAWN_AFTER_S)
                await self._release(job_id, fence,
                                    "re-run: its solver process was stopped by a signal")
                return
            except SolveFailed as exc:
                status = "failed"
                problem = exc.problem.model_copy(update={"job_id": job_id})
                fields = {"error": problem.model_dump_json(exclude_none=True)}
            except asyncio.CancelledError:
                held = self._held.get(job_id)
                if held is not None and held.lost:
                    return  # cancelled or taken over: the solve stopped, nothing to write
                # The server is stopping: give the job back.
                await self._release(job_id, fence,
                                    "re-run: the server stopped while this job was running")
                raise
            except Exception as exc:  # a planner bug: record it on the job, never lose it
                log.exception("job %s crashed", job_id)
                status = "failed"
                problem = Problem(type=SOLVE_FAILED, title="Planner error", status=500,
                                  detail=f"internal error: {type(exc).__name__}: {exc}",
                                  job_id=job_id)
                fields = {"error": problem.model_dump_json(exclude_none=True)}
            self._audit("solved", job_id, fence, status=status)
            held = self._held.get(job_id)
            if held is not None and held.lost:
                return
            if held is not None:
                held.finishing = True
            written = await asyncio.to_thread(self.store.finish, job_id, self.instance, fence,
                                              status, **fields)
            self._audit("finish", job_id, fence, status=status, written=written)
            if written:
                self.metrics.jobs.labels(status).inc()
            else:
                self.metrics.fenced_writes_rejected.inc()
                log.warning("job %s: result not written, the lease was lost", job_id)
        finally:
            held = self._held.get(job_id)
            if held is not None and held.fence == fence:
                del self._held[job_id]
            self._wake.set()
            self._notify(job_id)

    async def _release(self, job_id: str, fence: int, note: str) -> None:
        try:
            released = await asyncio.to_thread(self.store.release, job_id, self.instance,
                                               fence, note)
        except Exception:  # the lease expires anyway, and another replica takes it over
            log.exception("job %s: giving it back failed", job_id)
            return
        self._audit("release", job_id, fence, written=released)
        log.warning("job %s: %s", job_id, note)
