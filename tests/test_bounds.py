"""Memory and time within bounds whatever the input: YAML whose aliases expand without end, or a
file that never ends, is refused before anything is built from it (workload files, --reference-config, verify
--config, --engine-arg values); an HTTP error's endless body is read up to a cap; a stream that goes on past its
max_tokens without ending fails as `overrun` (tests/fake_server.py's faults)."""

import subprocess
import sys
from pathlib import Path

import pytest

from servetune import safeyaml
from servetune.loadgen import LoadShape, Target, run_load_sync
from servetune.loadgen.client import ERROR_BODY_BYTES, EXTRA_CHUNKS
from servetune.options import TuneArgs, UsageError
from servetune.workload import WorkloadError, load_workload
from servetune.workload.request import RequestSpec

FAKE_SERVER = Path(__file__).with_name("fake_server.py")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SERVETUNE = [sys.executable, "-m", "servetune"]
# nine levels of ten: 10^9 values once expanded, in 400 bytes
BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9))


@pytest.fixture(scope="module")
def fake() -> str:
    """A fake server streaming one token per 20 ms tick."""
    proc = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--token-delay-ms", "20"], stdout=subprocess.PIPE,
                            text=True)
    yield f"http://127.0.0.1:{proc.stdout.readline().split()[1]}"
    proc.kill()
    proc.wait()


def test_yaml_aliases_that_expand_without_end_are_refused_and_ordinary_ones_read():
    for text in (BOMB, "&a [*a]"):  # a bomb, and an alias that names itself
        with pytest.raises(safeyaml.TooBig, match="aliases expand to more than 1,000,000 values"):
            safeyaml.load(text)
    assert safeyaml.load("base: &b {type: fixed, value: 8}\nother: *b\n") == {
        "base": {"type": "fixed", "value": 8}, "other": {"type": "fixed", "value": 8}}


def test_a_workload_file_that_is_a_bomb_or_never_ends_is_refused(tmp_path):
    (tmp_path / "bomb.yaml").write_text(BOMB)
    with pytest.raises(WorkloadError, match=r"bomb\.yaml: its aliases expand to more than 1,000,000 values"):
        load_workload(tmp_path / "bomb.yaml")
    with pytest.raises(WorkloadError, match="/dev/zero: more than 1 MiB: not a workload or config file"):
        load_workload(Path("/dev/zero"))


@pytest.mark.parametrize("config", ["bomb", "/dev/zero"])
def test_a_reference_config_that_is_a_bomb_or_never_ends_is_refused_naming_the_option(tiny_model, tmp_path, config):
    path = tmp_path / "bomb.yaml" if config == "bomb" else Path(config)
    if config == "bomb":
        path.write_text(BOMB)
    args = TuneArgs(model=str(tiny_model), workload=EXAMPLES / "chat.yaml", out=tmp_path / "out",
                    slo=["tpot_p99_ms=50"], reference_config=[path])
    with pytest.raises(UsageError, match=rf"^--reference-config: {path}: cannot read the config: (its aliases|more)"):
        args.resolve()
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_verify_config_and_engine_arg_bombs_are_one_line_before_anything_launches(tiny_model, tmp_path):
    (tmp_path / "bomb.yaml").write_text(BOMB)
    proc = subprocess.run([*SERVETUNE, "verify", "--config", str(tmp_path / "bomb.yaml"), "--model", str(tiny_model),
                           "--workload", str(EXAMPLES / "chat.yaml"), "--rate", "1", "--json",
                           str(tmp_path / "v" / "v.json")], capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: --config: {tmp_path / 'bomb.yaml'}: cannot read the config: its aliases")
    inline = "x=[" + ", ".join(f"&a{i} [{', '.join([f'*a{i - 1}'] * 10) if i else 'y, y'}]" for i in range(9)) + "]"
    proc = subprocess.run([*SERVETUNE, "bench", "--launch", "--model", str(tiny_model), "--engine-arg", inline,
                           "--json", str(tmp_path / "b.json")], capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "its aliases expand to more than" in lines[0], proc.stderr
    assert not (tmp_path / "v").exists() and not (tmp_path / "b.server.log").exists()


@pytest.mark.integration
@pytest.mark.timeout(60)  # read whole, the endless body would never let the request end
def test_an_http_error_with_an_endless_body_is_read_up_to_a_cap(fake):
    result = run_load_sync(Target(fake, "m"), [RequestSpec("fake:error_body=1", 1, 8), RequestSpec("a b", 2, 8)])
    failed, ok = result.records
    assert failed.error == f"http_500: Internal Server Error {'x' * ERROR_BODY_BYTES}" and ok.ok


@pytest.mark.integration
@pytest.mark.timeout(60)  # the stall timeout fires on silence only: without a bound these streams never end
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("fault", ["endless", "ping"])
def test_a_stream_that_goes_on_past_its_max_tokens_fails_as_overrun(fake, endpoint, fault):
    requests = [RequestSpec(f"fake:{fault}=1", 1, 8), RequestSpec("a b", 2, 8)]
    result = run_load_sync(Target(fake, "m", endpoint), requests, LoadShape(request_timeout_s=30))
    overrun, ok = result.records
    assert overrun.error_kind == "overrun" and "max_tokens 8, and the stream went on" in overrun.error
    assert ok.ok and len(ok.chunk_ns) == (9 if endpoint == "chat" else 8)
    if fault == "endless":  # stopped at the first chunk past max_tokens and the allowance (a role, a last chunk)
        assert len(overrun.chunk_ns) == 8 + EXTRA_CHUNKS + 1


def test_an_engine_arg_config_file_is_read_within_bounds_and_its_values_checked_before_launch(tiny_model, tmp_path):
    """`--engine-arg config=FILE` is read as --reference-config is (bombs and endless files
    refused, values checked), its flags launched as engine args under those given beside it; vLLM never reads it."""
    (tmp_path / "bomb.yaml").write_text(BOMB)
    args = TuneArgs(model=str(tiny_model), workload=EXAMPLES / "chat.yaml", out=tmp_path / "out",
                    slo=["tpot_p99_ms=50"], engine_arg=[f"config={tmp_path / 'bomb.yaml'}"])
    with pytest.raises(UsageError, match=rf"^--engine-arg: {tmp_path / 'bomb.yaml'}: cannot read the config: "
                                         "its aliases expand to more than 1,000,000 values"):
        args.resolve()
    (tmp_path / "c.yaml").write_text("max-num-seqs: 8\nmax-model-len: 2k\nenforce-eager: true\n")
    given = args.model_copy(update={"engine_arg": [f"config={tmp_path / 'c.yaml'}", "max-num-seqs=16"]}).resolve()
    assert given.engine_args == {"max_num_seqs": 16, "max_model_len": 2000, "enforce_eager": True}
    (tmp_path / "c.yaml").write_text("max-num-seqs: abc\n")
    with pytest.raises(UsageError, match=rf"^--engine-arg: {tmp_path / 'c.yaml'}: max-num-seqs=abc: not a "
                                         "whole number above 0"):
        args.model_copy(update={"engine_arg": [f"config={tmp_path / 'c.yaml'}"]}).resolve()
    assert not (tmp_path / "out").exists()
