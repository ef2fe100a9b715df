"""Before launching: does a config fit, per servetune's memory model, calibrated on this study's launches."""

from typing import Any

from servetune.device import DeviceKind
from servetune.engine.installed import InstalledVllm
from servetune.engine.memory import (
    Calibration,
    Device,
    LaunchObservation,
    ModelShape,
    calibrate,
    choose_gpu_memory_utilization,
    max_gpu_memory_utilization,
    predict,
)

HEADROOM_FRACTION = 0.05  # of the GPU, left to what vLLM does not profile (CUDA context, NCCL, fragments)


class MemoryCheck:
    """Predicts vLLM's start-up memory plan for a config; each real launch's logged KV size refits it."""

    def __init__(self, shape: ModelShape, device: Device):
        self.shape, self.device = shape, device
        self.calibration: Calibration | None = None

    @classmethod
    def for_model(cls, model: str, vllm: InstalledVllm) -> "MemoryCheck | None":
        """None when the model's config cannot be read or the device's memory is unknown."""
        if not vllm.device_memory_bytes:
            return None
        try:
            shape = ModelShape.from_path(model)
        except (OSError, ValueError, KeyError):
            return None
        return cls(shape, Device(vllm.device_memory_bytes, kind=vllm.kind, name=vllm.device_name))

    def misfit(self, config: dict[str, Any]) -> str | None:
        """Why `config` would not start (predicted), or None."""
        estimate = predict(self.shape, self.device, config, self.calibration)
        return None if estimate.fits else estimate.reason

    def kv_cache_tokens(self, config: dict[str, Any]) -> int:
        """The KV cache vLLM will log for `config` (predicted)."""
        return predict(self.shape, self.device, config, self.calibration).kv_cache_tokens

    def longest_fitting(self, config: dict[str, Any]) -> int:
        """The longest max-model-len of which the KV cache of `config` holds one sequence (predicted; vLLM
        refuses to start above it); on a GPU without a gpu_memory_utilization, at the highest
        `gpu_memory_utilization` may choose."""
        if self.device.kind == DeviceKind.GPU and config.get("gpu_memory_utilization") is None:
            headroom = int(HEADROOM_FRACTION * self.device.memory_bytes)
            config = {**config, "gpu_memory_utilization": max_gpu_memory_utilization(self.device, headroom)}
        return predict(self.shape, self.device, config, self.calibration).max_fitting_model_len

    def gpu_memory_utilization(self, config: dict[str, Any]) -> float | None:
        """The largest utilization that leaves HEADROOM_FRACTION of the GPU free, chosen without trial and
        error; None when no utilization up to that lets the config start."""
        return choose_gpu_memory_utilization(self.shape, self.device, config, calibration=self.calibration,
                                             headroom_bytes=int(HEADROOM_FRACTION * self.device.memory_bytes))

    def observe(self, launches: list[tuple[dict[str, Any], int]]) -> Calibration:
        """Refit on every (config, logged KV cache tokens) launched so far."""
        observations = [LaunchObservation(config, tokens) for config, tokens in launches]
        self.calibration = calibrate(self.shape, self.device, observations)
        return self.calibration
