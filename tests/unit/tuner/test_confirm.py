"""The head-to-head decides the recommendation: the pick's own passing level stands as its confirmation, and the
defaults' level at or below the pick's rate (their own search's failure, or the defaults launched again at that
rate) decides whether it beats them (worked out from rows and outcomes, no server)."""

from servetune.study.results import TrialRow, beats
from servetune.tuner.confirm import candidates_of, decide, deciding_level, failed_at_or_below
from support import outcomes


def row(trial: int, role: str, low: float, high: float) -> TrialRow:
    return outcomes.row(trial, role, config={"max_num_seqs": trial}, goodput_bracket=[low, high], goodput_rate=low,
                        value=low)


DEFAULT, PICK = row(0, "default", 5.0, 6.0), row(3, "search", 10.0, 11.0)


def head_to_head(verdict: str, reasons: list[str] | None = None):
    return outcomes.level("confirm", 10.0, verdict=verdict, reasons=reasons, completed=120)


def test_the_pick_is_confirmed_when_the_defaults_fail_at_its_rate():
    result = decide(PICK, DEFAULT, head_to_head("fail", ["tpot_p99_ms: 9 of 120 requests over 25 ms"]), None)
    assert result.verdict == "confirmed" and result.recommended_trial == 3
    assert result.recommended_goodput_rate == 10.0 and result.default_goodput_rate == 5.0
    assert result.reason == "the defaults fail at 10.00 req/s (tpot_p99_ms: 9 of 120 requests over 25 ms)"
    assert result.head_to_head.verdict == "fail" and result.head_to_head.requests == 120
    assert result.pick.model_dump() == {"trial": 3, "rate": 10.0}  # without its deciding level: no empty fields


def test_defaults_that_hold_the_picks_rate_are_kept_at_that_rate():
    result = decide(PICK, DEFAULT, head_to_head("pass"), None)
    assert result.verdict == "not confirmed" and result.recommended_trial == 0
    assert result.recommended_goodput_rate == result.default_goodput_rate == 10.0  # measured: theirs now


def test_an_undecided_head_to_head_recommends_the_pick_without_a_gain():
    result = decide(PICK, DEFAULT, head_to_head("undecided", ["undecided: tpot_p99_ms: 2 of 400"]), None)
    assert result.verdict == "undecided" and result.recommended_trial == 3
    assert result.recommended_goodput_rate == 10.0 and "gain is not shown" in result.reason


def test_a_failure_of_the_defaults_own_search_at_or_below_the_picks_rate_decides_without_a_run():
    own = outcomes.ok(levels=[outcomes.level("capacity", float("inf")), outcomes.level("search", 12.0, passed=False),
                              outcomes.level("search", 9.0, verdict="fail", reasons=["ttft_p99_ms: 7 of 40 over"]),
                              outcomes.level("search", 7.0, verdict="undecided"), outcomes.level("search", 5.0)])
    level = failed_at_or_below(own, 10.0)
    assert level is own.levels[2]  # the highest decided failure at or below 10: not 12 (above), not 7 (undecided)
    assert failed_at_or_below(own, 8.0) is None
    result = decide(PICK, DEFAULT, level, None, method="search")
    assert result.verdict == "confirmed" and result.method == "search" and result.head_to_head.rate == 9.0
    assert result.reason == ("the defaults fail at 9.00 req/s in their own search, at or below trial 3's 10.00 "
                             "(ttft_p99_ms: 7 of 40 over)")


def test_without_a_head_to_head_the_pick_keeps_its_own_rate_and_says_why():
    for missing, why in ((None, "not measured at that rate"), ("oom: out of memory", "(oom: out of memory)")):
        result = decide(PICK, DEFAULT, None, None, missing=missing)
        assert result.verdict == "not run" and result.recommended_trial == 3
        assert result.recommended_goodput_rate == 10.0 and why in result.reason


def test_without_a_better_config_the_defaults_are_recommended_at_their_own_rate():
    result = decide(None, DEFAULT, None, None)
    assert result.verdict == "defaults" and result.recommended_trial == 0
    assert result.recommended_goodput_rate == 5.0 and result.reason == "no searched config beat them"
    nothing = decide(None, outcomes.row(0, "default", goodput_rate=None, goodput_bracket=[0.0, 0.3]), None, None)
    assert nothing.recommended_goodput_rate is None


def test_candidates_beat_the_defaults_beyond_resolution_best_first():
    rows = [DEFAULT, PICK, row(4, "search", 5.5, 6.5), row(5, "search", 8.0, 9.0)]
    found = candidates_of(rows, DEFAULT, lambda r, base: beats(r, base, "goodput"))
    assert [r.trial for r in found] == [3, 5]  # trial 4 passed below where the defaults failed


def test_the_deciding_level_is_the_passing_level_at_the_goodput_rate():
    out = outcomes.ok(levels=[outcomes.level("capacity", float("inf")), outcomes.level("search", 8.0),
                              outcomes.level("search", 10.0), outcomes.level("search", 12.0, passed=False)])
    assert deciding_level(out, 10.0) is out.levels[2]
    assert deciding_level(out, 12.0) is None
