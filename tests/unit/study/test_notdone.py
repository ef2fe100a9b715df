"""What a tune left undone is typed where the tuner makes it and said once, as the answer and the study say it."""

from servetune.study.notdone import CutShort, HeadToHeadUnrun, NothingMeasured, Stopped, Unlaunched


def test_each_thing_left_undone_is_said_as_the_answer_says_it():
    assert str(Unlaunched(left=3, budget=6, left_s=95, need_s=250)) == (
        "3 of 6 trials not launched: the 1m35s left hold no launch and first deciding level (~4m10s)")
    assert str(Unlaunched(left=1, budget=4, left_s=300, need_s=200, reserve_s=130)) == (
        "1 of 4 trials not launched: the 5m00s left hold no launch and first deciding level (~3m20s) beside the "
        "head-to-head (~2m10s)")
    assert str(NothingMeasured(2)) == (
        "trial 2 was stopped by the time limit before it measured anything: queued for --resume")
    why = "time limit: 40s left"
    assert str(CutShort(why, trial=1)) == "trial 1's rate search was cut short (time limit: 40s left)"
    assert str(CutShort(why)) == "the head-to-head with the defaults was cut short (time limit: 40s left)"
    assert str(HeadToHeadUnrun(150)) == "the head-to-head with the defaults (~2m30s): the time limit came first"
    assert str(Stopped()) == "interrupted: continue with the same command and --resume"
    assert str(Stopped(path="/out/trial-0003/records.jsonl", error="No space left on device")) == (
        "stopped: cannot write /out/trial-0003/records.jsonl (No space left on device): the trial running then runs "
        "again on --resume")
