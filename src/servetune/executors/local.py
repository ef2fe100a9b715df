"""Several trials at once on this host, each in its own worker process, packed onto free devices."""

import multiprocessing
import os
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future

from servetune.engine import InstalledVllm
from servetune.engine._guard import die_with
from servetune.errors import ServetuneError
from servetune.executors._base import Job, WorkerError, WorkerLost, run_job
from servetune.study.outcome import TrialOutcome


def visible_gpus(count: int) -> list[str]:
    """The GPU ids trials may use: CUDA_VISIBLE_DEVICES as the user set it, else 0 .. count-1."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [g.strip() for g in given.split(",") if g.strip()]
    return [str(i) for i in range(count)]


class LocalPool:
    """Up to `slots` trials at once, each in a spawned worker process that dies with this one. On GPUs a
    trial gets as many free GPUs as its tensor x pipeline parallel size (CUDA_VISIBLE_DEVICES); on CPU each
    slot owns an equal share of the cores (process affinity and vLLM's OpenMP binding). Every server gets
    a port no other servetune process of this user holds (`engine.ports.reserve_port`)."""

    def __init__(self, slots: int, vllm: InstalledVllm, work: Callable[[Job], TrialOutcome] = run_job):
        self.slots, self.vllm, self.work = slots, vllm, work
        self.on_cpu = vllm.on_cpu
        if self.on_cpu:
            cores = sorted(os.sched_getaffinity(0))
            if slots > len(cores):
                raise ServetuneError(f"--parallel {slots}: this host has {len(cores)} CPU cores, one slot needs one")
            share = len(cores) // slots
            self.free: list = [tuple(cores[i * share:(i + 1) * share]) for i in range(slots)]
        else:
            self.free = visible_gpus(vllm.device_count)
            if slots > len(self.free):
                raise ServetuneError(f"--parallel {slots}: {len(self.free)} GPUs are visible, one trial needs one")
        self.devices = len(self.free)
        self.lock = threading.Lock()
        self.procs: dict[int, multiprocessing.process.BaseProcess] = {}
        self.context = multiprocessing.get_context("spawn")

    def probe(self) -> InstalledVllm:
        return self.vllm

    def misfit(self, job: Job) -> str | None:
        if not self.on_cpu and job.devices > self.devices:
            return f"needs {job.devices} GPUs, {self.devices} are visible"
        return None

    def submit(self, job: Job) -> Future[TrialOutcome] | None:
        need = 1 if self.on_cpu else job.devices
        with self.lock:
            if len(self.procs) >= self.slots or need > len(self.free):
                return None
            units, self.free = self.free[:need], self.free[need:]
        env, cores = self._placement(job, units)
        receive, send = self.context.Pipe(duplex=False)
        proc = self.context.Process(target=_worker, args=(self.work, job, env, cores, send, os.getpid()), daemon=True,
                                    name=f"servetune-trial-{job.number}")
        proc.start()
        send.close()
        future: Future[TrialOutcome] = Future()
        assert proc.pid is not None  # started
        with self.lock:
            self.procs[proc.pid] = proc
        threading.Thread(target=self._collect, args=(proc, receive, future, units), daemon=True).start()
        return future

    def _placement(self, job: Job, units: list) -> tuple[dict[str, str], tuple[int, ...]]:
        if not self.on_cpu:
            return {"CUDA_VISIBLE_DEVICES": ",".join(units)}, ()
        cores = units[0]
        per_rank = max(1, len(cores) // job.devices)  # vLLM on CPU binds one core list per rank
        lists = [cores[i * per_rank:(i + 1) * per_rank] for i in range(job.devices)]
        return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(",".join(map(str, c)) for c in lists)}, cores

    def _collect(self, proc, receive, future: Future[TrialOutcome], units: list) -> None:
        try:
            kind, value = receive.recv()
        except EOFError:
            kind, value = "lost", None
        proc.join()
        with self.lock:
            self.procs.pop(proc.pid, None)
            self.free.extend(units)
        if kind == "ok":
            future.set_result(value)
        elif kind == "error":
            future.set_exception(WorkerError(value))
        else:
            future.set_exception(WorkerLost(f"worker {proc.pid} exited ({proc.exitcode}) before its trial ended"))

    def close(self) -> None:
        with self.lock:
            procs = list(self.procs.values())
        for proc in procs:
            proc.terminate()  # SIGTERM: the worker stops its server
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()


def _worker(work: Callable[[Job], TrialOutcome], job: Job, env: dict[str, str], cores: tuple[int, ...], send,
            tuner: int) -> None:
    """A worker process: dies with the tuner (PDEATHSIG), takes its devices, runs one job. A worker that
    is killed sends nothing: the tuner sees the pipe close and runs the trial again."""
    if not die_with(tuner):
        return
    os.environ.update(env)
    if cores:
        os.sched_setaffinity(0, cores)
    try:
        send.send(("ok", work(job)))
    except KeyboardInterrupt:  # stopped (`close`): its server went as the trial unwound; the tuner sees the pipe close
        return
    except Exception:
        send.send(("error", traceback.format_exc(limit=20)))
