"""Workloads the tests of more than one file run."""

from servetune.workload import WorkloadSpec

# 20 requests of 32 prompt tokens and 8 reply tokens each
WORKLOAD = {"num_requests": 20, "input_len": {"type": "fixed", "value": 32},
            "output_len": {"type": "fixed", "value": 8}}


def sessions_spec(**fields) -> WorkloadSpec:
    """A chat workload of multi-turn sessions: 7 turns, sessions of 3 with 0.5 s of thought between turns; `fields`
    override."""
    fields = {"num_requests": 7, "endpoint": "chat", "input_len": {"type": "fixed", "value": 5},
              "output_len": {"type": "fixed", "value": 3},
              "sessions": {"turns": {"type": "fixed", "value": 3}, "think_time_s": 0.5}} | fields
    return WorkloadSpec.model_validate(fields)
