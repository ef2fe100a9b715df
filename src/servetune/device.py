"""What a vLLM server runs on, as servetune plans for it: a GPU or the CPU (vLLM's own platform name, e.g. "cuda",
stays in `engine.installed.InstalledVllm.device_type`)."""

from enum import StrEnum


class DeviceKind(StrEnum):
    CPU = "cpu"
    GPU = "gpu"

    @classmethod
    def of(cls, on_cpu: bool) -> "DeviceKind":
        return cls.CPU if on_cpu else cls.GPU
