"""Run by the engine's Python: print the installed vLLM's version, platform and server flags as JSON.

A standalone script (no servetune import) so it works in any environment that has vLLM.
"""

import argparse
import json
import sys


def main() -> None:
    import vllm
    from vllm.platforms import current_platform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM <= 0.2x
        from vllm.entrypoints.openai.cli_args import make_arg_parser

    flags = {}
    for action in make_arg_parser(FlexibleArgumentParser())._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or action.dest == "help":
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            kind = "bool"
        elif action.nargs == 0:
            kind = "flag"
        else:
            kind = "value"
        default = action.default
        if not isinstance(default, (str, int, float, bool, type(None), list)):
            default = repr(default)
        flags[longs[0][2:].replace("-", "_")] = {
            "kind": kind,
            "default": default,
            "choices": list(action.choices) if action.choices else None,
        }
    try:
        memory, name = int(current_platform.get_device_total_memory()), str(current_platform.get_device_name())
    except Exception:  # not every platform can tell
        memory, name = None, ""
    try:
        count = 0 if current_platform.device_type == "cpu" else int(current_platform.device_count())
    except Exception:  # older platforms
        import torch

        count = torch.cuda.device_count() if current_platform.device_type == "cuda" else 0
    json.dump(
        {"vllm_version": vllm.__version__, "device_type": current_platform.device_type, "flags": flags,
         "device_memory_bytes": memory, "device_name": name, "device_count": count},
        sys.stdout,
        default=str,
    )


if __name__ == "__main__":
    main()
