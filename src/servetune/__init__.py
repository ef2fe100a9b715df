"""servetune: find the fastest vLLM configuration by measuring the real engine."""

__version__ = "0.1.0"
