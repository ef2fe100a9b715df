"""Engine-arg values checked from the knob declarations: a value of the wrong kind given with
--engine-arg or in a --reference-config is one line naming it and what it takes, before vLLM is probed or launched;
vLLM's readable counts (8k, 8K) are read as vLLM reads them. In the CLI:
tests/integration/test_engine_arg_values_integration.py."""

import pytest

from servetune.knobs import KNOBS, checked
from servetune.options import TuneArgs, UsageError
from support.paths import ROOT


@pytest.mark.parametrize(("arg", "value", "read"), [
    ("max_model_len", "8k", 8000), ("max_model_len", "8K", 8192), ("max_num_batched_tokens", "25.6k", 25600),
    ("max_num_seqs", 64, 64), ("gpu_memory_utilization", 1, 1), ("cpu_kvcache_space_gib", 0.5, 0.5),
    ("enforce_eager", True, True), ("kv_cache_dtype", "fp8", "fp8"), ("served_model_name", 7, 7)])
def test_a_value_of_its_kind_is_read_as_vllm_reads_it(arg, value, read):
    assert checked(arg, value) == read


@pytest.mark.parametrize(("arg", "value", "message"), [
    ("max_model_len", "abc", "max-model-len=abc: not a whole number above 0 (vLLM also reads 8k as 8,000 and 8K "
                             "as 8,192)"),
    ("max_model_len", "1.5K", "max-model-len=1.5K: not a whole number above 0"),
    ("max_num_seqs", 0, "max-num-seqs=0: not a whole number above 0"),
    ("max_num_seqs", 8.5, "max-num-seqs=8.5: not a whole number above 0"),
    ("block_size", True, "block-size=true: not a whole number above 0"),
    ("gpu_memory_utilization", 1.5, "gpu-memory-utilization=1.5: not a number above 0 and at most 1"),
    ("cpu_kvcache_space_gib", float("inf"), "cpu-kvcache-space-gib=Infinity: not a number above 0"),
    ("enable_prefix_caching", 1, "enable-prefix-caching=1: not true or false"),
    ("kv_cache_dtype", 8, "kv-cache-dtype=8: not a name")])
def test_a_value_of_another_kind_is_refused_saying_what_it_takes(arg, value, message):
    with pytest.raises(ValueError) as refused:
        checked(arg, value)
    assert str(refused.value).startswith(message)


def test_every_value_the_search_tries_is_of_its_declared_kind():
    for knob in KNOBS:
        for value in (*knob.cpu, *knob.gpu, *(knob.from_model_len(4096) if knob.from_model_len else ())):
            assert checked(knob.arg, value) == value, knob.arg


def test_tune_reads_its_engine_args_and_reference_configs_by_their_declarations(tiny_model, tmp_path):
    args = TuneArgs(model=str(tiny_model), workload=ROOT / "examples" / "chat.yaml", out=tmp_path / "out",
                    slo=["tpot_p99_ms=50"], engine_arg=["max-model-len=2k"])
    assert args.resolve().engine_args == {"max_model_len": 2000}
    with pytest.raises(UsageError, match=r"^--engine-arg: max-model-len=abc: not a whole number above 0"):
        args.model_copy(update={"engine_arg": ["max-model-len=abc"]}).resolve()
    (tmp_path / "ref.yaml").write_text("gpu-memory-utilization: 1.5\n")
    with pytest.raises(UsageError, match=rf"^--reference-config: {tmp_path / 'ref.yaml'}: gpu-memory-utilization=1.5: "
                                         "not a number above 0 and at most 1$"):
        args.model_copy(update={"reference_config": [tmp_path / "ref.yaml"]}).resolve()
    (tmp_path / "ref.yaml").write_text("1: 2\n")
    with pytest.raises(UsageError, match="a vLLM config file is a mapping of flag names to values"):
        args.model_copy(update={"reference_config": [tmp_path / "ref.yaml"]}).resolve()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("given", "instead"), [
    ("host=0.0.0.0", "host: servetune's server listens on 127.0.0.1 only, on a port it picks: to measure a server "
                     "of yours, run it yourself and use `servetune bench --base-url`"),
    ("port=1", "port: servetune's server listens on 127.0.0.1 only, on a port it picks"),
    ("uds=/tmp/s", "uds: servetune's server listens on 127.0.0.1 only"),
    ("middleware=x.Y", "middleware: servetune's server lets in only servetune (a secret of each launch's)"),
    ("api-key=k", "api-key: servetune's server lets in only servetune"),
    ("model=/m", "model: use --model"),
    ("served-model-name=m", "served-model-name: use --model"),
    ("ssl-keyfile=k.pem", "ssl-keyfile: servetune speaks plain HTTP to its server on loopback"),
    ("headless=true", "headless: servetune measures vLLM's API server"),
])
def test_servetunes_own_engine_args_are_refused_naming_what_to_use_instead(tiny_model, tmp_path, given, instead):
    """An engine arg that would override how servetune launches and reaches its server (vLLM keeps
    the last of a repeated flag) is one line naming the option to use instead; in a config file too."""
    args = TuneArgs(model=str(tiny_model), workload=ROOT / "examples" / "chat.yaml", out=tmp_path / "out",
                    slo=["tpot_p99_ms=50"], engine_arg=[given])
    with pytest.raises(UsageError) as refused:
        args.resolve()
    assert str(refused.value).startswith(f"--engine-arg: {instead}")
    key, _, value = given.partition("=")
    if key == "model":  # a config file's model is left out, as vLLM's `--config` leaves it to the command line
        return
    (tmp_path / "ref.yaml").write_text(f"{key}: {value}\n")
    with pytest.raises(UsageError) as refused:
        args.model_copy(update={"engine_arg": [], "reference_config": [tmp_path / "ref.yaml"]}).resolve()
    assert str(refused.value).startswith(f"--reference-config: {tmp_path / 'ref.yaml'}: {instead}")
    assert not (tmp_path / "out").exists()
