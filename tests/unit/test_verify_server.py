"""`servetune verify` with the server as arbiter: the sentence that says, per SLO, which client's p99 the server's
own latency histograms bear out. End to end, with tests/fake_engine.py standing in for vLLM:
tests/integration/test_verify_server_integration.py."""

import pytest

from servetune.engine.histograms import Quantile
from servetune.verify import SloCheck, arbiter


def check(p99_ms: float, agrees: bool | None, low_ms: float = 100.0, high_ms: float | None = 250.0) -> SloCheck:
    server = None if agrees is None else Quantile(estimate_ms=200.0, low_ms=low_ms, high_ms=high_ms)
    return SloCheck(name="ttft_p99_ms", bound_ms=2000, p99_ms=p99_ms, requests=600, passed=True,
                    server_p99=server, agrees=agrees)


@pytest.mark.parametrize(("ours", "theirs", "says"), [
    (check(180, True), check(240, True), "servetune's client and vLLM's client agree with the server, within its "
                                         "buckets"),
    (check(180, True), None, "servetune's client agrees with the server, within its buckets"),
    (check(2722, False), check(190, True), "vLLM's client agrees with the server; servetune's client does not: its "
                                           "2,722 ms, the server's 100-250 ms"),
    (check(20, False, 1000, None), check(30, False, 1000, None),
     "neither client agrees with the server; servetune's client does not: its 20 ms, the server's over 1,000 ms; "
     "vLLM's client does not: its 30 ms, the server's over 1,000 ms"),
    (check(180, True), check(190, None), "the server's histograms do not say for vLLM's client (no /metrics, no "
                                         "such histogram, or nothing counted)"),
])
def test_the_arbiters_sentence(ours, theirs, says):
    assert arbiter(ours, theirs) == says
