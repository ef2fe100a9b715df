"""Trials as Ray tasks on a cluster: each asks for as many GPUs as its tensor x pipeline parallel size and
runs on whichever node has them; its files come back with its outcome. Every node needs servetune, vLLM
and the model at the same path."""

import logging
import os
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import ray
import ray.exceptions

from servetune.engine import InstalledVllm, probe
from servetune.errors import ServetuneError
from servetune.executors._base import Job, WorkerError, WorkerLost, run_job
from servetune.study.outcome import TrialOutcome


def _run_on_node(work: Callable[[Job], TrialOutcome], job: Job) -> tuple[TrialOutcome, dict[str, bytes]]:
    """Run the job in a scratch directory of the node; return its outcome as it is (its paths are relative
    to the trial's directory) and the trial's files, which the tuner writes into `job.out_dir`."""
    with tempfile.TemporaryDirectory(prefix=f"servetune-trial-{job.number}-") as scratch:
        outcome = work(replace(job, out_dir=Path(scratch)))
        files = {p.name: p.read_bytes() for p in Path(scratch).iterdir() if p.is_file()}
    return outcome, files


def _probe_node() -> InstalledVllm:
    return probe()


def _token_hint() -> str:
    """Where this machine's Ray auth token comes from, if it has one: a token turns on Ray's token authentication
    (Ray >= 2.52), and any local `ray.init()` since Ray 2.59 leaves one in ~/.ray/auth_token, so a cluster started
    without it (or with another) refuses this machine after a long wait and a message that does not say why."""
    default = Path.home() / ".ray" / "auth_token"
    source = ("RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN")
              else os.environ.get("RAY_AUTH_TOKEN_PATH") or (str(default) if default.exists() else None))
    if source is None and os.environ.get("RAY_AUTH_MODE") != "token":
        return ""
    return (f" (this machine has Ray token authentication on: {source or 'RAY_AUTH_MODE=token'}; the cluster must "
            "use the same token, or remove it if a local ray.init() left it)")


class RayCluster:
    """At most `slots` trials at once on the Ray cluster at `address` (default: as many as it has GPUs, or
    nodes on a CPU cluster). A trial whose worker or node dies raises WorkerLost; Ray does not retry it."""

    def __init__(self, address: str, slots: int | None = None, work: Callable[[Job], TrialOutcome] = run_job):
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError, ray.exceptions.AuthenticationError) as e:
            raise ServetuneError(f"--ray-address {address}: cannot join the Ray cluster: "
                                 f"{str(e).splitlines()[0]}{_token_hint()}") from None
        nodes = [n for n in ray.nodes() if n["Alive"]]
        self.gpus_per_node = max((int(n["Resources"].get("GPU", 0)) for n in nodes), default=0)
        total = int(ray.cluster_resources().get("GPU", 0))
        self.slots = slots or total or len(nodes)
        self.running = 0
        self.lock = threading.Lock()
        self.refs: dict[int, ray.ObjectRef] = {}
        self.work = work  # shipped to the node with each job (cloudpickle: by reference when importable there)
        self._run = ray.remote(max_retries=0)(_run_on_node)

    def probe(self) -> InstalledVllm:
        """The vLLM of a worker node (on a GPU node when the cluster has GPUs)."""
        remote = ray.remote(num_gpus=1 if self.gpus_per_node else 0, max_retries=0)(_probe_node)
        return ray.get(remote.remote())

    def misfit(self, job: Job) -> str | None:
        if self.gpus_per_node and job.devices > self.gpus_per_node:
            return f"needs {job.devices} GPUs on one node, the largest node has {self.gpus_per_node}"
        return None

    def submit(self, job: Job) -> Future[TrialOutcome] | None:
        with self.lock:
            if self.running >= self.slots:
                return None
            self.running += 1
        ref = self._run.options(num_gpus=job.devices if self.gpus_per_node else 0, num_cpus=1,
                                name=f"servetune-trial-{job.number}").remote(self.work, job)
        self.refs[job.number] = ref
        future: Future[TrialOutcome] = Future()
        ref.future().add_done_callback(lambda done: self._finish(job, done, future))
        return future

    def _finish(self, job: Job, done: Future, future: Future[TrialOutcome]) -> None:
        with self.lock:
            self.running -= 1
            self.refs.pop(job.number, None)
        try:
            outcome, files = done.result()
        except ray.exceptions.RayTaskError as e:
            future.set_exception(WorkerError(str(e)))
            return
        except ray.exceptions.RayError as e:  # worker crashed, node died, task cancelled
            future.set_exception(WorkerLost(f"{type(e).__name__}: {str(e).splitlines()[0]}"))
            return
        job.out_dir.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (job.out_dir / name).write_bytes(data)
        future.set_result(outcome)

    def close(self) -> None:
        with self.lock:  # taken once: a second close must not call Ray (it would start a local Ray to cancel in)
            refs, self.refs = list(self.refs.values()), {}
        for ref in refs:
            ray.cancel(ref, force=True)  # kills the worker; its server's guard stops the server
        ray.shutdown()
