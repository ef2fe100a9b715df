"""Load generator: sends requests on vLLM's arrival schedule and records raw ns timestamps."""

from servetune.loadgen.arrival import ArrivalProcess, schedule_ns
from servetune.loadgen.client import Client, Target
from servetune.loadgen.records import LoadResult, RequestRecord
from servetune.loadgen.runner import LoadShape, run_load, run_load_sync

__all__ = [
    "ArrivalProcess",
    "Client",
    "LoadResult",
    "RequestRecord",
    "Target",
    "LoadShape",
    "run_load",
    "run_load_sync",
    "schedule_ns",
]
