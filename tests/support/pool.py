"""Stand-in jobs for the worker pools (what a real trial cannot do on demand: die, report its placement, outlive its
tuner) and the devices they are placed on. Workers import them by name: tests/ must be on their path."""

import os
import signal
import time
from pathlib import Path

from servetune.engine import InstalledVllm
from servetune.executors import Job

GPUS = InstalledVllm("0.0", "cuda", {}, 80 * 2**30, "test GPU", device_count=3)
CPU = InstalledVllm("0.0", "cpu", {})


def placement(job: Job) -> dict:
    """A stand-in job: where the worker runs, after holding its devices for `hold_s` (a dict, not an outcome:
    the pool hands on whatever its work returns)."""
    time.sleep(job.config.get("hold_s", 0))
    return {"pid": os.getpid(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), "cores": sorted(os.sched_getaffinity(0))}


def dies(job: Job) -> dict:
    """A stand-in job whose worker kills itself (SIGKILL)."""
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def sleeps(job: Job) -> dict:
    """A stand-in job that writes its worker's pid to `pid_file` and sleeps ten minutes."""
    Path(job.config["pid_file"]).write_text(str(os.getpid()))
    time.sleep(600)
    return {}


def job(number: int, **config) -> Job:
    """Trial `number`'s job for `config`, without a plan."""
    return Job(number, config, None, Path("/nonexistent"))
