"""Engine arguments: a mapping of vLLM flag names to values, turned into a `vllm serve` argv."""

import json
import shlex
from collections.abc import Mapping
from typing import Any

import yaml

from servetune import safeyaml
from servetune.engine.installed import InstalledVllm
from servetune.errors import ServetuneError
from servetune.knobs import CPU_KVCACHE_SPACE  # not a vLLM flag: launched as --kv-cache-memory-bytes

PSEUDO_ARGS = frozenset({CPU_KVCACHE_SPACE})

# What servetune sets itself, or what would change how it launches and reaches its server (vLLM keeps the last of a
# repeated flag): refused from the user's engine args (`options.checked_args`), each with what to do instead.
_LOOPBACK = ("servetune's server listens on 127.0.0.1 only, on a port it picks: to measure a server of yours, run it "
             "yourself and use `servetune bench --base-url`")
_SECRET = "servetune's server lets in only servetune (a secret of each launch's)"
_PLAIN = "servetune speaks plain HTTP to its server on loopback"
SERVETUNES_OWN = {
    "host": _LOOPBACK, "port": _LOOPBACK, "uds": _LOOPBACK, "middleware": _SECRET, "api_key": _SECRET,
    "model": "use --model", "served_model_name": "use --model (servetune's requests name the model by it)",
    **dict.fromkeys(("ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "ssl_cert_reqs", "ssl_ciphers",
                     "enable_ssl_refresh"), _PLAIN),
    "headless": "servetune measures vLLM's API server, which a headless vLLM does not start",
    "config": "servetune reads one config file itself (`--engine-arg config=FILE`): copy the flags of the other "
              "into it",
}


def normalize(engine_args: Mapping[str, Any]) -> dict[str, Any]:
    """Keys in snake_case ('max-num-seqs' and 'max_num_seqs' are the same flag)."""
    return {k.replace("-", "_"): v for k, v in engine_args.items()}


def parse_value(text: str) -> Any:
    """A `key=value` value from the command line: YAML scalars (true, 8192, 0.9, null, {..}), read within bounds
    (`safeyaml`); text YAML cannot read is taken as it is."""
    if text == "":
        return ""
    try:
        return safeyaml.load(text)
    except yaml.YAMLError:
        return text


def parse_pairs(pairs: list[str]) -> dict[str, Any]:
    """['max-num-seqs=64', 'enforce-eager=true'] -> {'max_num_seqs': 64, 'enforce_eager': True}."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ServetuneError(f"{pair!r} is not key=value")
        try:
            out[key.strip().replace("-", "_")] = parse_value(value.strip())
        except safeyaml.TooBig as e:
            raise ServetuneError(f"{pair[:60]!r}: {e}") from None
    return out


def to_argv(engine_args: Mapping[str, Any]) -> list[str]:
    """Flags for vLLM: booleans as --x / --no-x, dicts as JSON, lists as repeated values; None is left out."""
    argv: list[str] = []
    for key, value in normalize(engine_args).items():
        if key in PSEUDO_ARGS or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + flag[2:])
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


def unsupported(engine_args: Mapping[str, Any], vllm: InstalledVllm) -> list[str]:
    """Names the installed vLLM does not accept, or accepts only as a one-way flag it cannot negate."""
    bad = []
    for key, value in normalize(engine_args).items():
        if key in PSEUDO_ARGS:
            continue
        flag = vllm.flags.get(key)
        if flag is None or (flag["kind"] == "flag" and value is False):
            bad.append(key)
    return bad


def drop_unsupported(engine_args: Mapping[str, Any], vllm: InstalledVllm) -> dict[str, Any]:
    """The arguments without those the installed vLLM does not accept."""
    bad = set(unsupported(engine_args, vllm))
    return {k: v for k, v in normalize(engine_args).items() if k not in bad}


def serve_command(model: str, engine_args: Mapping[str, Any]) -> str:
    """The `vllm serve` shell command for a config (as launched: see launcher.resolve_args)."""
    return shlex.join(["vllm", "serve", model, *to_argv(engine_args)])
