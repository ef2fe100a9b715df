"""Workloads: what to send to the server (lengths, prefixes, datasets) and at what load shape."""

from servetune.workload.load import load_workload
from servetune.workload.prompts import MorePrompts, build_requests, load_tokenizer
from servetune.workload.request import RequestSpec
from servetune.workload.spec import (
    DatasetSpec,
    Fixed,
    LengthDistribution,
    LogNormal,
    Normal,
    RateUnit,
    SharedPrefix,
    Uniform,
    WorkloadError,
    WorkloadSpec,
)

__all__ = [
    "DatasetSpec",
    "Fixed",
    "LengthDistribution",
    "LogNormal",
    "MorePrompts",
    "Normal",
    "RateUnit",
    "RequestSpec",
    "SharedPrefix",
    "Uniform",
    "WorkloadError",
    "WorkloadSpec",
    "build_requests",
    "load_tokenizer",
    "load_workload",
]
