import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
from pydantic import TypeAdapter
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from servetune.tinymodel import write_tiny_model
from servetune.workload import (
    DatasetSpec,
    LengthDistribution,
    MorePrompts,
    WorkloadError,
    WorkloadSpec,
    build_requests,
    load_tokenizer,
    load_workload,
    prompts,
)
from support.paths import EXAMPLES


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    return load_tokenizer(write_tiny_model(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A byte-level BPE that adds a BOS, trained here: decoding random ids and re-encoding changes the count."""
    rng = np.random.default_rng(0)
    alphabet = list("abcdefghijklmnopqrstuvwxyz0123456789.,'!?-éß中")
    corpus = [" ".join("".join(rng.choice(alphabet, rng.integers(1, 9))) for _ in range(50)) for _ in range(300)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")


def spec(**fields) -> WorkloadSpec:
    fields.setdefault("num_requests", 40)
    fields.setdefault("input_len", {"type": "uniform", "min": 20, "max": 300})
    fields.setdefault("output_len", {"type": "fixed", "value": 16})
    return WorkloadSpec.model_validate(fields)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- length distributions -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dist", "mean", "std"),
    [
        ({"type": "fixed", "value": 128}, 128, 0),
        ({"type": "uniform", "min": 100, "max": 300}, 200, 200 / math.sqrt(12)),
        ({"type": "normal", "mean": 500, "std": 50, "min": 1, "max": 10_000}, 500, 50),
        ({"type": "lognormal", "mean": 400, "std": 200, "min": 1, "max": 100_000}, 400, 200),
    ],
)
def test_distribution_moments(dist, mean, std):
    samples = TypeAdapter(LengthDistribution).validate_python(dist).sample(np.random.default_rng(1), 50_000)
    assert samples.dtype == np.int64
    assert samples.mean() == pytest.approx(mean, rel=0.02)
    assert samples.std() == pytest.approx(std, rel=0.05, abs=0.6)


@pytest.mark.parametrize(
    "dist",
    [
        {"type": "uniform", "min": 7, "max": 9},
        {"type": "normal", "mean": 100, "std": 80, "min": 50, "max": 120},
        {"type": "lognormal", "mean": 100, "std": 300, "min": 10, "max": 400},
    ],
)
def test_distribution_bounds(dist):
    samples = TypeAdapter(LengthDistribution).validate_python(dist).sample(np.random.default_rng(2), 20_000)
    assert samples.min() == dist["min"] and samples.max() == dist["max"]


# --- spec files -----------------------------------------------------------------------------------------------


def test_load_workload_full_file(tmp_path):
    path = write(
        tmp_path / "w.yaml",
        """
num_requests: 100
seed: 7
input_len: {type: lognormal, mean: 1000, std: 300, min: 600, max: 2000}
output_len: {type: uniform, min: 16, max: 32}
prefix: {length: 512, groups: 4}
request_rate: .inf
burstiness: 0.5
max_concurrency: 8
endpoint: chat
""",
    )
    workload = load_workload(path)
    assert workload.input_len.type == "lognormal" and workload.prefix.groups == 4
    assert workload.request_rate == math.inf and workload.burstiness == 0.5 and workload.endpoint == "chat"


def test_defaults_and_random_constructor():
    workload = WorkloadSpec.random(input_len=1024, output_len=128, num_requests=10, seed=3, request_rate=2.5)
    assert workload.input_len.value == 1024 and workload.output_len.value == 128
    assert (workload.num_requests, workload.seed, workload.request_rate) == (10, 3, 2.5)
    assert workload.burstiness == 1.0 and workload.max_concurrency is None
    assert spec(request_rate="inf").request_rate == math.inf
    assert spec().endpoint == "completions" and spec().request_rate == math.inf


def test_dataset_path_is_relative_to_the_workload_file(tmp_path):
    path = write(tmp_path / "w.yaml", "num_requests: 5\ndataset: {path: data/sg.json, format: sharegpt}\n")
    assert load_workload(path).dataset.path == tmp_path / "data" / "sg.json"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("num_requests: 5\ninput_len: {type: normal, mean: -3, std: 1}\noutput_len: {type: fixed, value: 4}\n",
         "w.yaml: input_len.mean: Input should be greater than 0"),
        ("num_requests: 5\ninput_len: {type: fixed, value: 8}\noutput_len: {type: fixed, value: 4}\nrate: 3\n",
         "w.yaml: rate: Extra inputs are not permitted"),
        ("num_requests: 5\ninput_len: {type: gauss, value: 8}\noutput_len: {type: fixed, value: 4}\n",
         "w.yaml: input_len: Input tag 'gauss' found using 'type' does not match any of the expected tags"),
        ("num_requests: 5\ninput_len: {type: uniform, min: 9, max: 3}\noutput_len: {type: fixed, value: 4}\n",
         "w.yaml: input_len: max (3) must be >= min (9)"),
        ("num_requests: 5\ninput_len: {type: fixed, value: 8}\n",
         "w.yaml: input_len and output_len are required unless a dataset is given"),
        ("num_requests: 5\ninput_len: {type: fixed, value: 8}\noutput_len: {type: fixed, value: 4}\n"
         "prefix: {length: 8}\n", "w.yaml: input_len must always exceed prefix.length (8)"),
        ("num_requests: 5\noutput_len: {type: fixed, value: 4}\ndataset: {path: x.json, format: sharegpt}\n",
         "w.yaml: output_len cannot be combined with dataset"),
        ("num_requests: 0\ninput_len: {type: fixed, value: 8}\noutput_len: {type: fixed, value: 4}\n",
         "w.yaml: num_requests: Input should be greater than 0"),
        ("num_requests: [5\n", "w.yaml: invalid YAML at line 2, column 1:"),
        ("- 1\n- 2\n", "w.yaml: Input should be a valid dictionary"),
    ],
)
def test_invalid_files_give_one_line_errors(tmp_path, text, message):
    with pytest.raises(WorkloadError) as error:
        load_workload(write(tmp_path / "w.yaml", text))
    assert str(error.value).startswith(str(tmp_path / message)), str(error.value)
    assert "\n" not in str(error.value)


def test_missing_file(tmp_path):
    with pytest.raises(WorkloadError, match=r"nope\.yaml: cannot read: No such file"):
        load_workload(tmp_path / "nope.yaml")


def test_examples_are_valid():
    examples = sorted(EXAMPLES.glob("*.yaml"))
    assert len(examples) >= 3
    for path in examples:
        load_workload(path)


def test_missing_tokenizer_is_a_workload_error(tmp_path):
    with pytest.raises(WorkloadError, match="cannot load tokenizer"):
        load_tokenizer(tmp_path / "no-model")


# --- synthetic prompts ----------------------------------------------------------------------------------------


def test_tiny_tokenizer_prompts_are_token_exact(tiny_tokenizer):
    workload = spec(num_requests=50, input_len={"type": "uniform", "min": 1, "max": 2000})
    requests = build_requests(workload, tiny_tokenizer)
    expected = workload.input_len.sample(np.random.default_rng(workload.seed), 50)
    assert [r.prompt_len for r in requests] == expected.tolist()
    for r in requests:
        assert len(tiny_tokenizer(r.prompt).input_ids) == len(r.prompt.split()) == r.prompt_len
        assert type(r.prompt_len) is int and type(r.output_len) is int and r.output_len == 16


def test_bpe_prompts_are_token_exact(bpe_tokenizer):
    workload = spec(num_requests=60, input_len={"type": "uniform", "min": 2, "max": 1500})
    requests = build_requests(workload, bpe_tokenizer)
    for r in requests:
        ids = bpe_tokenizer(r.prompt).input_ids
        assert len(ids) == r.prompt_len  # the BOS the tokenizer adds is counted, as the server counts it
        assert ids.count(bpe_tokenizer.bos_token_id) == 1 and bpe_tokenizer.eos_token_id not in ids


@pytest.mark.parametrize("tokenizer_name", ["tiny_tokenizer", "bpe_tokenizer"])
def test_prefix_groups_share_exactly_their_prefix(request, tokenizer_name):
    tokenizer = request.getfixturevalue(tokenizer_name)
    workload = spec(
        num_requests=24, input_len={"type": "uniform", "min": 70, "max": 200}, prefix={"length": 64, "groups": 3}
    )
    requests = build_requests(workload, tokenizer)
    heads = [tokenizer(r.prompt, add_special_tokens=False).input_ids[:64] for r in requests]
    for i, r in enumerate(requests):
        assert len(tokenizer(r.prompt).input_ids) == r.prompt_len
        assert heads[i] == heads[i % 3]
        assert requests[i].prompt.startswith(tokenizer.decode(heads[i % 3]))
    assert len({tuple(h) for h in heads}) == 3
    assert len({r.prompt for r in requests}) == 24


def test_same_seed_same_requests_other_seed_fresh_ones(tiny_tokenizer):
    workload = spec(prefix={"length": 10, "groups": 2})
    assert build_requests(workload, tiny_tokenizer) == build_requests(workload, tiny_tokenizer, seed=workload.seed)
    first, second = build_requests(workload, tiny_tokenizer, seed=1), build_requests(workload, tiny_tokenizer, seed=2)
    first_words = {tuple(r.prompt.split()[:12]) for r in first}
    assert not first_words & {tuple(r.prompt.split()[:12]) for r in second}


def test_count_overrides_num_requests(tiny_tokenizer):
    assert len(build_requests(spec(num_requests=5), tiny_tokenizer, count=12)) == 12


def test_a_billion_requests_are_refused_at_once_naming_the_limit(tiny_tokenizer):
    started = time.monotonic()
    with pytest.raises(WorkloadError, match=r"^1,000,000,000 requests to build: at most 1,000,000 in one run"):
        build_requests(spec(num_requests=1_000_000_000), tiny_tokenizer)
    assert time.monotonic() - started < 1


def test_more_requests_than_memory_holds_are_refused_with_the_limit(tiny_tokenizer, monkeypatch):
    monkeypatch.setattr(prompts, "available_memory_bytes", lambda: 100 * 2**20)
    workload = spec(input_len={"type": "fixed", "value": 1024}, output_len={"type": "uniform", "min": 64, "max": 192})
    each = 1024 + 16 * 1024 + 48 * 128  # bytes: a request, its prompt's tokens and its output's chunk timestamps
    assert prompts.request_bytes(workload, 10) == each
    with pytest.raises(WorkloadError) as error:
        build_requests(workload, tiny_tokenizer, count=5000)
    assert str(error.value) == (f"5,000 requests to build: about 112 MiB in memory (23 KiB each), more than 50% of "
                                f"the 100 MiB available; at most {50 * 2**20 // each:,} requests of this workload")
    assert len(build_requests(workload, tiny_tokenizer, count=3)) == 3


def test_a_trace_is_sized_by_the_rows_it_replays(tmp_path, tiny_tokenizer, monkeypatch):
    monkeypatch.setattr(prompts, "available_memory_bytes", lambda: 2**20)
    path = write(tmp_path / "t.csv", "timestamp,input_tokens,output_tokens\n0,10,4\n1,400,100\n")
    workload = WorkloadSpec.model_validate({"num_requests": 10**12, "trace": {"path": str(path)}})
    assert prompts.request_bytes(workload, 10**12) == 1024 + 16 * 205 + 48 * 52
    assert len(build_requests(workload, tiny_tokenizer)) == 2


def test_available_memory_is_read():
    assert 0 < prompts.available_memory_bytes() < 2**50


def test_input_too_short_for_prefix_and_special_tokens(bpe_tokenizer):
    workload = spec(input_len={"type": "fixed", "value": 11}, prefix={"length": 10})
    with pytest.raises(WorkloadError, match="input_len 11 leaves no text"):
        build_requests(workload, bpe_tokenizer)


# --- datasets -------------------------------------------------------------------------------------------------


def sharegpt_entry(human: str, gpt: str | None, first: str = "human") -> dict:
    turns = [{"from": first, "value": human}] + ([{"from": "gpt", "value": gpt}] if gpt is not None else [])
    return {"id": "x", "conversations": turns}


def words(n: int, start: int = 0) -> str:
    return " ".join("baba beba biba boba bubu".split()[(start + i) % 5] for i in range(n))


def dataset_spec(path: Path, format: str, **limits) -> WorkloadSpec:
    return WorkloadSpec(num_requests=3, seed=0, dataset=DatasetSpec(path=path, format=format, **limits))


def test_sharegpt_first_human_turn_and_gpt_reply_length(tmp_path, tiny_tokenizer):
    entries = [
        sharegpt_entry(words(10), words(20)),
        {"conversations": [{"from": "system", "value": "x"}, {"from": "human", "value": words(6)},
                           {"from": "gpt", "value": words(7)}, {"from": "human", "value": words(99)}]},
        sharegpt_entry(words(3), words(50)),  # prompt too short
        sharegpt_entry(words(30), words(3)),  # reply too short
        sharegpt_entry(words(1100), words(5)),  # prompt too long
        sharegpt_entry(words(1000), words(1100)),  # total too long
        sharegpt_entry(words(8), None),  # no reply
    ]
    path = write(tmp_path / "sg.json", json.dumps(entries))
    requests = build_requests(dataset_spec(path, "sharegpt"), tiny_tokenizer, count=20)
    assert {(r.prompt, r.prompt_len, r.output_len) for r in requests} == {(words(10), 10, 20), (words(6), 6, 7)}
    wide = dataset_spec(path, "sharegpt", min_len=1, max_prompt_len=4096, max_total_len=4096)
    assert len({r.prompt for r in build_requests(wide, tiny_tokenizer, count=50)}) == 6


def test_dataset_sampling_follows_the_seed(tmp_path, tiny_tokenizer):
    entries = [sharegpt_entry(words(10, i), words(10 + i)) for i in range(40)]
    path = write(tmp_path / "sg.json", json.dumps(entries))
    workload = dataset_spec(path, "sharegpt")
    assert build_requests(workload, tiny_tokenizer, count=10) == build_requests(workload, tiny_tokenizer, count=10)
    assert build_requests(workload, tiny_tokenizer, seed=1) != build_requests(workload, tiny_tokenizer, seed=2)
    assert len({r.output_len for r in build_requests(workload, tiny_tokenizer, count=40)}) == 40


def test_jsonl_requests(tmp_path, tiny_tokenizer):
    lines = '{"prompt": "kobu azfe", "max_tokens": 5}\n\n{"prompt": "bala", "max_tokens": 9}\n'
    path = write(tmp_path / "r.jsonl", lines)
    requests = build_requests(dataset_spec(path, "jsonl"), tiny_tokenizer, count=2)
    assert sorted((r.prompt, r.prompt_len, r.output_len) for r in requests) == [("bala", 1, 9), ("kobu azfe", 2, 5)]


@pytest.mark.parametrize(
    ("name", "format", "text", "message"),
    [
        ("r.jsonl", "jsonl", '{"prompt": "a", "max_tokens": 5}\n{"prompt": "b"}\n',
         "r.jsonl:2: max_tokens: Field required"),
        ("r.jsonl", "jsonl", '{"prompt": "a", "max_tokens": 5}\n\n{"prompt": "b", \n', "r.jsonl:3: Invalid JSON"),
        ("r.jsonl", "jsonl", '{"prompt": "a", "max_tokens": 0}\n', "r.jsonl:1: max_tokens: Input should be greater"),
        ("sg.json", "sharegpt", '[{"conversations": []},\n {"conversations": [{"from": "human"}]}]',
         "sg.json: entry 1: conversations.0.value: Field required"),
        ("sg.json", "sharegpt", '[\n{"conversations": ]', "sg.json: Invalid JSON: expected value at line 2"),
        ("sg.json", "sharegpt", '{"conversations": []}', "sg.json: Input should be a valid array"),
        ("sg.json", "sharegpt", json.dumps([sharegpt_entry("a", "b")]), "sg.json: no usable entries"),
        ("r.jsonl", "jsonl", '{"prompt": "a", "max_tokens": 5}\n{"prompt": "", "max_tokens": 5}\n',
         "r.jsonl:2: prompt: empty"),
        ("r.jsonl", "jsonl", '{"prompt": " \\n ", "max_tokens": 5}\n', "r.jsonl:1: prompt: empty (only whitespace)"),
        ("r.jsonl", "jsonl", "", "r.jsonl: the file is empty (no JSON lines)"),
        ("r.jsonl", "jsonl", "\n  \n", "r.jsonl: the file is empty (no JSON lines)"),
        ("sg.json", "sharegpt", "", "sg.json: the file is empty"),
        ("sg.json", "sharegpt", "[]", "sg.json: no conversations (the file holds an empty list)"),
        ("sg.json", "sharegpt", json.dumps([sharegpt_entry("a", None)]),
         "sg.json: no conversation has a human turn followed by a gpt reply"),
        ("missing.json", "sharegpt", None, "missing.json: cannot read: No such file"),
    ],
)
def test_bad_dataset_files(tmp_path, tiny_tokenizer, name, format, text, message):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(WorkloadError) as error:
        build_requests(dataset_spec(path, format), tiny_tokenizer)
    assert str(error.value).startswith(f"{tmp_path}/{message}"), str(error.value)
    assert "\n" not in str(error.value)


def test_more_prompts_are_fresh_fit_the_pool_and_travel_with_a_trial(tmp_path_factory):
    """A level that needs more prompts than the pool holds gets fresh ones of the same workload (level k of every
    trial the same), never longer than the pool's longest request (the configs' max-model-len is fitted to it),
    built in whatever process runs the trial from the tokenizer's path."""
    import pickle

    model = write_tiny_model(tmp_path_factory.mktemp("tiny"))
    spec = WorkloadSpec.model_validate({"num_requests": 50, "output_len": {"type": "fixed", "value": 8},
                                        "input_len": {"type": "lognormal", "mean": 200, "std": 300, "min": 16,
                                                      "max": 2000}})
    pool = build_requests(spec, load_tokenizer(model), seed=1, count=50)
    longest = sorted(r.min_model_len for r in pool)[-5]  # a tail the pool's longest few go past
    more = pickle.loads(pickle.dumps(MorePrompts(spec, str(model), seed=2, longest=longest)))
    fresh = more(300, 3)
    assert len(fresh) == 300 and all(r.min_model_len <= longest for r in fresh)
    assert {r.prompt for r in fresh}.isdisjoint(r.prompt for r in pool)
    assert more(300, 3) == fresh and more(300, 4) != fresh
