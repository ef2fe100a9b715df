"""The one sentence a tune ends with (`results.answer`, printed by the CLI and the report): what to run, the rate
it holds and how it was decided, or plainly that no rate held, and what was not done."""

from servetune.results import answer


def entry(trial: int, rate: float) -> dict:
    return {"trial": trial, "goodput_rate": rate, "request_throughput": 2 * rate, "config": {}}


def row(trial: int, rate: float, bracket: tuple[float, float]) -> dict:
    return {"trial": trial, "status": "ok", "value": rate, "goodput_bracket": list(bracket)}


def summary(**given) -> dict:
    return {"state": "complete", "not_done": [], "objective": "goodput", "rate_unit": "req/s", "confidence": 0.95,
            "default": entry(0, 5.0), "best": entry(0, 5.0), "best_beats_default": False, "gain": None,
            "confirmation": None} | given


def test_a_confirmed_pick_says_its_rate_how_sure_and_why():
    confirmation = {"recommended_goodput_rate": 10.0, "reason": "the defaults fail at 10.00 req/s (...)"}
    text = answer(summary(best=entry(3, 10.0), best_beats_default=True, gain=1.0, confirmation=confirmation),
                  [row(0, 5.0, (5, 6)), row(3, 10.0, (10, 11))])
    assert text == ("Run trial #3's config: it holds 10.00 req/s within the SLOs (decided at 95% confidence); "
                    "the defaults fail at 10.00 req/s (...).")


def test_a_pick_where_the_defaults_held_no_rate_is_not_a_percentage():
    text = answer(summary(default=entry(0, 0.0), best=entry(2, 22.25), best_beats_default=True),
                  [row(0, 0.0, (0, 8.0)), row(2, 22.25, (22.25, 22.8))])
    assert "beats vLLM's defaults: it holds 22.25 req/s" in text and "where they held no rate" in text


def test_no_rate_held_is_said_plainly_with_the_best_estimate_and_what_was_not_done():
    text = answer(summary(default=entry(0, 0.0), best=entry(0, 0.0), state="time-limit",
                          not_done=["the head-to-head with the defaults: the time limit came first"]),
                  [row(0, 0.0, (0.0, 8.0))])
    assert text.startswith("At the time limit: keep vLLM's defaults: no rate held the SLOs")
    assert "down to 8.00 req/s); the best estimate is below that rate" in text
    assert text.endswith("Not done: the head-to-head with the defaults: the time limit came first.")


def test_a_study_made_before_statistical_verdicts_says_how_its_rate_was_decided():
    assert "by its levels' p99s" in answer(summary(confidence=None), [row(0, 5.0, (5, 6))])
