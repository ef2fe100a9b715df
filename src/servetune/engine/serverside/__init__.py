"""Modules loaded by vLLM in the servers servetune launches, from this directory put on their PYTHONPATH: they import
nothing of servetune (vLLM's Python need not have it)."""
