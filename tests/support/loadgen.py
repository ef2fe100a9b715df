"""Requests for the load generator's tests."""

from servetune.workload.request import RequestSpec


def specs(n, output_len=16, prompt="one two three"):
    """`n` requests of `prompt` (one token a word) for `output_len` tokens each."""
    return [RequestSpec(prompt, len(prompt.split()), output_len)] * n
