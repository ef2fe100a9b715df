"""The one sentence a tune ends with (`results.answer`, printed by the CLI and the report): what to run, the rate it
holds and how it was decided, or plainly that no rate held, and what was not done."""

from servetune.study.record import HeadToHead
from servetune.study.results import Summary, SummaryEntry, TimeSpent, answer
from support import outcomes


def entry(trial: int, rate: float | None, bracket: tuple[float, float] | None = None) -> SummaryEntry:
    return SummaryEntry(trial=trial, goodput_rate=rate, request_throughput=2 * (rate or 1.0), config={},
                        p99_ttft_ms=None, p99_tpot_ms=None, slo_p99={"tpot_p99_ms": None},
                        goodput_bracket=list(bracket) if bracket else None)


def row(trial: int, rate: float, bracket: tuple[float, float]):
    return outcomes.row(trial, value=rate, goodput_bracket=list(bracket))


def summary(**given) -> Summary:
    return Summary(**{"state": "complete", "not_done": [], "time_limit_s": None, "elapsed_s": None,
                      "objective": "goodput", "slo": {}, "rate_unit": "req/s", "confidence": 0.95,
                      "default": entry(0, 5.0), "best": entry(0, 5.0), "best_beats_default": False, "gain": None,
                      "confirmation": None, "budget": [], "trials": 1, "failed": 0, "skipped": 0, "model": "m",
                      "strategy": "optuna", "vllm_version": "0.32.0", "device": "cpu"} | given)


def test_a_confirmed_pick_says_its_rate_how_sure_and_why():
    confirmation = HeadToHead(verdict="confirmed", recommended_trial=3, recommended_goodput_rate=10.0,
                              default_goodput_rate=5.0, reason="the defaults fail at 10.00 req/s (...)")
    text = answer(summary(best=entry(3, 10.0), best_beats_default=True, gain=1.0, confirmation=confirmation),
                  [row(0, 5.0, (5, 6)), row(3, 10.0, (10, 11))])
    assert text == ("Run trial #3's config: it holds 10.00 req/s within the SLOs (decided at 95% confidence); "
                    "the defaults fail at 10.00 req/s (...).")


def test_a_pick_where_the_defaults_held_no_rate_is_not_a_percentage():
    text = answer(summary(default=entry(0, None, (0.0, 8.0)), best=entry(2, 22.25), best_beats_default=True),
                  [row(0, 0.0, (0, 8.0)), row(2, 22.25, (22.25, 22.8))])
    assert "beats vLLM's defaults: it holds 22.25 req/s" in text and "where they hold no rate down to 8.00" in text


def test_no_rate_decided_is_said_plainly_with_what_was_measured_and_what_was_not_done():
    text = answer(summary(default=entry(0, None, (0.0, 8.0)), best=entry(0, None, (0.0, 8.0)), state="time-limit",
                          not_done=["trial 0's rate search was cut short (time limit: ...)"]),
                  [row(0, 0.0, (0.0, 8.0))])
    assert text.startswith("At the time limit: no rate decided: vLLM's defaults hold no rate down to 8.00 req/s "
                           "(capacity 2.00 req/s at full load); no other config was measured.")
    assert text.endswith("Not done: trial 0's rate search was cut short (time limit: ...).")
    spent = TimeSpent(elapsed_s=600, launches_s=200, levels_s=390, head_to_head_s=0, other_s=10, unused_s=0,
                      more_s=420.0)  # a cut level and a trial not launched would have needed 7 more minutes
    slow = answer(summary(default=entry(0, None, (0.0, 0.9)), best=entry(0, None, (0.0, 0.9)), state="time-limit",
                          time_limit_s=600, time=spent), [row(0, 0.0, (0.0, 0.9))])
    assert "no other config was measured; give it ~17 minutes." in slow
    unmeasured = answer(summary(default=entry(0, None), best=entry(0, None)), [row(0, 0.0, (0.0, 8.0))])
    assert unmeasured == ("No rate decided: vLLM's defaults were not measured to a verdict (no level finished); no "
                          "other config was measured.")


def test_a_study_made_before_statistical_verdicts_says_how_its_rate_was_decided():
    assert "by its levels' p99s" in answer(summary(confidence=None), [row(0, 5.0, (5, 6))])


def test_summary_json_has_a_command_and_headroom_only_with_a_best_config():
    assert {"best_command", "headroom"} <= set(summary(best_command="vllm serve m").model_dump())
    assert not {"best_command", "headroom"} & set(summary(best=None, default=None).model_dump())


def test_a_candidate_that_lost_its_race_says_so_after_its_capacity_level():
    out = outcomes.ok(request_throughput=17.94, levels=[
        outcomes.level("capacity", float("inf"), passed=False),
        outcomes.level("race", 9.67, passed=False, reasons=["itl_p99_ms: 36 of 1347 gaps over 20 ms"])])
    assert out.describe() == ("lost the race: fail at 9.67 req/s, the best rate measured before it "
                              "(itl_p99_ms: 36 of 1347 gaps over 20 ms); capacity 17.94 req/s")
    # a race run twice (its first ended early on a narrow fail) is told by its last, and says so
    twice = out.model_copy(update={"levels": [*out.levels, outcomes.level(
        "race", 9.67, passed=False, reasons=["itl_p99_ms: 40 of 1400 gaps over 20 ms"])]})
    assert twice.describe() == ("lost the race: fail at 9.67 req/s, the best rate measured before it, run 2 times "
                                "(itl_p99_ms: 40 of 1400 gaps over 20 ms); capacity 17.94 req/s")


def test_a_rate_whose_level_was_undecided_is_not_called_not_passed():
    """The H200 heavy-tailed tune said "not passed at 5.49" of a level whose tests were still open (p99 ITL 32 ms
    of 35), a rate vLLM's own client then held: the line says what the level said."""
    levels = [outcomes.level("capacity", float("inf"), passed=False),
              outcomes.level("search", 6.46, verdict="undecided"), outcomes.level("search", 5.49, verdict="undecided"),
              outcomes.level("search", 4.67)]
    out = outcomes.ok(request_throughput=14.35, goodput_rate=4.67, goodput_bracket=(4.67, 5.49), levels=levels)
    assert out.describe() == "goodput rate 4.67 req/s (undecided at 5.49); capacity 14.35 req/s"
    failed_above = out.model_copy(update={"levels": [*levels[:2], outcomes.level("search", 5.49, passed=False),
                                                      levels[3]]})
    assert failed_above.describe() == "goodput rate 4.67 req/s (not passed at 5.49); capacity 14.35 req/s"
    # the report's table says the same (its row carries the levels)
    assert outcomes.row(0, levels=levels, goodput_bracket=[4.67, 5.49]).said_above == "undecided"
    assert outcomes.row(0, levels=failed_above.levels, goodput_bracket=[4.67, 5.49]).said_above == "not passed"
    assert outcomes.row(0, levels=levels, goodput_bracket=[4.67, None]).said_above is None  # every rate passed
