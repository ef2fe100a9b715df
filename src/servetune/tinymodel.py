"""A tiny random-weight Llama with a word-level tokenizer, written offline and byte-identical every time.

It lets servetune (and its tests) drive a real vLLM engine without any model hub. Every word in the
vocabulary is one token and the tokenizer adds no BOS, so a prompt of N space-separated words is
exactly N prompt tokens on the completions endpoint. Given another tokenizer's directory (a real 128k BPE
vocabulary, say), the same tiny network is written around that tokenizer instead.
"""

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SEED = 0
VOCAB_SIZE = 4096
HIDDEN_SIZE = 256
INTERMEDIATE_SIZE = 768
NUM_LAYERS = 4
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = HIDDEN_SIZE // NUM_HEADS
MAX_POSITIONS = 4096

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
SPECIAL_TOKENS = [UNK, BOS, EOS, "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS] + [v + c for v in _VOWELS for c in _CONSONANTS]


def vocabulary() -> list[str]:
    """All tokens in id order: the special tokens, then made-up words like "kobu" or "azfe"."""
    n = len(_SYLLABLES)
    return SPECIAL_TOKENS + [_SYLLABLES[i % n] + _SYLLABLES[i // n] for i in range(VOCAB_SIZE - len(SPECIAL_TOKENS))]


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_tiny_model(out_dir: Path, tokenizer_dir: Path | None = None) -> Path:
    """Write the model (config, weights, tokenizer) into `out_dir` and return it. With `tokenizer_dir`, its
    tokenizer files are copied and the vocabulary sized to them (BOS/EOS ids from its tokenizer.json)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bos: int | None  # None: a tokenizer_dir whose BOS or EOS token is not in its vocabulary
    eos: int | None
    vocab_size, bos, eos = VOCAB_SIZE, 1, 2
    if tokenizer_dir is None:
        _write_json(out_dir / "tokenizer_config.json", _tokenizer_config())
        (out_dir / "tokenizer.json").write_text(_tokenizer().to_str(pretty=True) + "\n")
    else:
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_dir) / name).exists():
                shutil.copy(Path(tokenizer_dir) / name, out_dir / name)
        vocab_size, bos, eos = _vocab_facts(out_dir)
    _write_json(out_dir / "config.json", _config(vocab_size, bos, eos))
    _write_json(out_dir / "generation_config.json", {"bos_token_id": bos, "eos_token_id": eos})
    save_file(_weights(vocab_size), out_dir / "model.safetensors", metadata={"format": "pt"})
    return out_dir


def _vocab_facts(model_dir: Path) -> tuple[int, int | None, int | None]:
    """(vocabulary size, BOS id, EOS id) of the tokenizer in `model_dir` (None: a token not in its vocabulary)."""
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    config = json.loads((model_dir / "tokenizer_config.json").read_text())

    def token_id(key: str) -> int | None:
        token = config.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        return tokenizer.token_to_id(token) if token else 0

    return tokenizer.get_vocab_size(with_added_tokens=True), token_id("bos_token"), token_id("eos_token")


def _config(vocab_size: int, bos: int | None, eos: int | None) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "tie_word_embeddings": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "dtype": "float32",  # vLLM's `--dtype auto` serves float32 checkpoints in bfloat16 where the CPU has it
    }


def _tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }


def _tokenizer() -> Tokenizer:
    vocab = {token: i for i, token in enumerate(vocabulary())}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return tokenizer


def _weights(vocab_size: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(SEED)

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.02, shape).astype(np.float32)

    ones = np.ones(HIDDEN_SIZE, dtype=np.float32)
    kv_dim = NUM_KV_HEADS * HEAD_DIM
    tensors = {"model.embed_tokens.weight": normal(vocab_size, HIDDEN_SIZE)}
    for layer in range(NUM_LAYERS):
        p = f"model.layers.{layer}."
        tensors |= {
            p + "input_layernorm.weight": ones,
            p + "self_attn.q_proj.weight": normal(NUM_HEADS * HEAD_DIM, HIDDEN_SIZE),
            p + "self_attn.k_proj.weight": normal(kv_dim, HIDDEN_SIZE),
            p + "self_attn.v_proj.weight": normal(kv_dim, HIDDEN_SIZE),
            p + "self_attn.o_proj.weight": normal(HIDDEN_SIZE, NUM_HEADS * HEAD_DIM),
            p + "post_attention_layernorm.weight": ones,
            p + "mlp.gate_proj.weight": normal(INTERMEDIATE_SIZE, HIDDEN_SIZE),
            p + "mlp.up_proj.weight": normal(INTERMEDIATE_SIZE, HIDDEN_SIZE),
            p + "mlp.down_proj.weight": normal(HIDDEN_SIZE, INTERMEDIATE_SIZE),
        }
    tensors["model.norm.weight"] = ones
    tensors["lm_head.weight"] = normal(vocab_size, HIDDEN_SIZE)
    return tensors


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
