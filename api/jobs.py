"""Solving off the event loop: a process pool (pebble) with a per-task time limit, a bound on
concurrent solves, a bounded wait queue, and jobs that survive a restart through the store.

The event loop only schedules work and awaits futures; `plan()` runs in worker processes
(DESIGN.md: a 3 s solve inside the loop held the health endpoint for 3.4 s).
"""

import asyncio
import logging
import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from pebble import ProcessExpired, ProcessPool

from api import worker
from api.metrics import Metrics
from api.problems import BAD_INPUT, INFEASIBLE, SOLVE_FAILED, Problem
from api.settings import ServiceSettings
from api.store import JobRow, Store

log = logging.getLogger("planner.service")

_POLL_S = 0.05
_RESPAWN_AFTER_S = 1.0
_RECOVER_EVERY_BEATS = 5


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
    return Problem(type=INFEASIBLE, title="No plan fits", status=422, detail=outcome["reason"],
                   table=outcome["table"], cap=outcome["cap"],
                   short_bytes=outcome["short_bytes"], job_id=job_id)


class JobRunner:
    def __init__(self, settings: ServiceSettings, store: Store, metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.boot = uuid.uuid4().hex
        self.pid = os.getpid()
        self._pool: ProcessPool | None = None
        self._slots = asyncio.Semaphore(settings.max_concurrent_solves)
        self._waiting: set[object] = set()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._beat: asyncio.Task[None] | None = None
        self._warm: asyncio.Future[Any] | None = None

    # Life cycle
    async def start(self) -> None:
        # spawn, not fork: the server process has threads (sqlite, the event loop's executor).
        self._pool = ProcessPool(max_workers=self.settings.max_concurrent_solves,
                                 initializer=worker.warm_up,
                                 context=multiprocessing.get_context("spawn"))
        # Start the workers now (imports take seconds), so the first request does not wait.
        self._warm = asyncio.gather(*(
            asyncio.wrap_future(self._pool.schedule(worker.warm_up))
            for _ in range(self.settings.max_concurrent_solves)), return_exceptions=True)
        await asyncio.to_thread(self.store.heartbeat, self.boot, self.pid)
        await self.recover()
        self._beat = asyncio.create_task(self._heartbeat())

    async def stop(self) -> None:
        """Leave unfinished jobs in the store as they are: the next start re-runs them."""
        tasks = [t for t in (self._beat, self._warm, *self._tasks.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._pool is not None:
            self._pool.stop()
            await asyncio.to_thread(self._pool.join, 10)
        await asyncio.to_thread(self.store.forget_instance, self.boot)

    @property
    def ready(self) -> bool:
        """The pool runs and its workers have started (imported the planner)."""
        return (self._pool is not None and self._pool.active and self._warm is not None
                and self._warm.done())

    async def _heartbeat(self) -> None:
        beats = 0
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            try:
                await asyncio.to_thread(self.store.heartbeat, self.boot, self.pid)
                beats += 1
                if beats % _RECOVER_EVERY_BEATS == 0:
                    await self.recover()
            except Exception:  # keep beating; the next beat retries
                log.exception("heartbeat failed")

    async def recover(self) -> None:
        """Re-run jobs whose server stopped mid-way, or fail them after max_attempts starts."""
        stale = self.settings.heartbeat_s * _RECOVER_EVERY_BEATS
        orphans = await asyncio.to_thread(self.store.claim_orphans, self.boot, self.pid, stale)
        for row in orphans:
            if row.attempts >= self.settings.max_attempts:
                await self._fail_interrupted(row.id, row.attempts)
                continue
            note = (f"re-run: the server stopped while this job was {row.status} "
                    f"(after {row.attempts} start{'s' if row.attempts != 1 else ''})")
            await asyncio.to_thread(self.store.requeue, row.id, self.boot, note)
            log.warning("job %s: %s", row.id, note)
            self._spawn(row.id, row.request, row.time_limit_s)

    async def _fail_interrupted(self, job_id: str, attempts: int) -> None:
        problem = Problem(type=SOLVE_FAILED, title="Interrupted", status=503,
                          detail=f"the server stopped during this job {attempts} times; it "
                                 "is not re-run again (POST it to retry)", job_id=job_id)
        await asyncio.to_thread(self.store.finish, job_id, self.boot, "failed",
                                error=problem.model_dump_json(exclude_none=True))
        self.metrics.jobs.labels("failed").inc()
        log.warning("job %s failed: interrupted %d times", job_id, attempts)

    # Pool
    async def call(self, fn: Callable[[str], worker.Outcome], arg: str, timeout_s: float,
                   on_start: Callable[[], Awaitable[None]] | None = None,
                   token: object | None = None) -> worker.Outcome:
        """Run fn(arg) in the pool once a solver slot is free; SolveFailed if it cannot."""
        token = object() if token is None else token
        if token not in self._waiting:
            if len(self._waiting) >= self.settings.max_queued_jobs:
                raise Busy
            self._waiting.add(token)
        self.metrics.jobs_waiting.set(len(self._waiting))
        try:
            await self._slots.acquire()
        finally:
            self._waiting.discard(token)
            self.metrics.jobs_waiting.set(len(self._waiting))
        try:
            if on_start is not None:
                await on_start()
            assert self._pool is not None
            self.metrics.solves_running.inc()
            start = time.perf_counter()
            future = self._pool.schedule(fn, (arg,), timeout=timeout_s)
            try:
                # Cancelling the wrapper cancels the pebble future, which stops its process.
                return await asyncio.wrap_future(future)
            except TimeoutError:
                raise SolveFailed(Problem(
                    type=SOLVE_FAILED, title="Solve ran past its time limit", status=422,
                    detail=f"the solve did not finish within {timeout_s:g} s (options."
                           "time_limit_s plus the service's overhead allowance)")) from None
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
        finally:
            self._slots.release()

    # Jobs
    def _respawn(self, job_id: str, request_json: str, time_limit_s: float) -> None:
        self._tasks.pop(job_id, None)
        self._spawn(job_id, request_json, time_limit_s)

    def _spawn(self, job_id: str, request_json: str, time_limit_s: float) -> None:
        token = object()
        # Counted as waiting now, so a burst of POSTs sees the queue fill up at once.
        self._waiting.add(token)
        task = asyncio.create_task(self._run(job_id, request_json, time_limit_s, token))
        self._tasks[job_id] = task
        task.add_done_callback(lambda t: self._forget(job_id, t))

    def _forget(self, job_id: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(job_id) is task:
            del self._tasks[job_id]

    async def _run(self, job_id: str, request_json: str, time_limit_s: float,
                   token: object) -> None:
        async def started() -> None:
            await asyncio.to_thread(self.store.mark_running, job_id, self.boot)

        fields: dict[str, Any]
        try:
            outcome = await self.call(worker.solve, request_json,
                                      self.settings.solve_deadline_s(time_limit_s), started, token)
            status = str(outcome["status"])
            if status == "succeeded":
                fields = {"plan": outcome["plan"], "plan_hash": outcome["plan_hash"]}
            else:
                fields = {"error": problem_of(outcome, job_id).model_dump_json(exclude_none=True)}
        except Interrupted:
            row = await asyncio.to_thread(self.store.get_job, job_id)
            if row is not None and row.attempts >= self.settings.max_attempts:
                await self._fail_interrupted(job_id, row.attempts)
                return
            note = "re-run: its solver process was stopped by a signal"
            log.warning("job %s: %s", job_id, note)
            await asyncio.to_thread(self.store.requeue, job_id, self.boot, note)
            # Later, so a server that is stopping cancels it first and the next start runs it.
            await asyncio.sleep(_RESPAWN_AFTER_S)
            self._respawn(job_id, request_json, time_limit_s)
            return
        except SolveFailed as exc:
            status = "failed"
            problem = exc.problem.model_copy(update={"job_id": job_id})
            fields = {"error": problem.model_dump_json(exclude_none=True)}
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a planner bug: record it on the job, never lose the job
            log.exception("job %s crashed", job_id)
            status = "failed"
            problem = Problem(type=SOLVE_FAILED, title="Planner error", status=500,
                              detail=f"internal error: {type(exc).__name__}: {exc}",
                              job_id=job_id)
            fields = {"error": problem.model_dump_json(exclude_none=True)}
        await asyncio.to_thread(self.store.finish, job_id, self.boot, status, **fields)
        self.metrics.jobs.labels(status).inc()

    async def submit(self, job_id: str, request_json: str, tables: int,
                     time_limit_s: float) -> tuple[JobRow, bool]:
        """The job for this request: the stored one, or a new one queued (created=True)."""
        existing = await asyncio.to_thread(self.store.get_job, job_id)
        if existing is not None and existing.status != "failed":
            return existing, False
        if len(self._waiting) >= self.settings.max_queued_jobs:
            raise Busy
        if existing is not None:  # a failed job is re-run when it is asked for again
            row = await asyncio.to_thread(self.store.retry_failed, job_id, self.boot, self.pid)
            created = row is not None
        else:
            row, created = await asyncio.to_thread(
                self.store.create_job, job_id, request_json, tables, time_limit_s, self.boot,
                self.pid)
        if row is None:
            row = await asyncio.to_thread(self.store.get_job, job_id)
            assert row is not None
        if created:
            self._spawn(job_id, request_json, time_limit_s)
        return row, created

    async def wait(self, job_id: str, timeout_s: float) -> JobRow | None:
        """The job once finished, or as it stands after timeout_s."""
        task = self._tasks.get(job_id)
        if task is not None:
            await asyncio.wait({task}, timeout=timeout_s)
        else:  # run by another worker process of this server: watch the store
            end = time.monotonic() + timeout_s
            while time.monotonic() < end:
                row = await asyncio.to_thread(self.store.get_job, job_id)
                if row is None or row.status not in ("queued", "running"):
                    return row
                await asyncio.sleep(_POLL_S)
        return await asyncio.to_thread(self.store.get_job, job_id)
