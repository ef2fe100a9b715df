"""The max-model-len that `servetune bench --launch` checks its prompts against before launching: the model's
context, or the --engine-arg's. The CLI against faults: tests/integration/test_cli_faults.py."""


def test_the_max_model_len_a_launch_gets(tiny_model):
    from servetune.measure.bench import launch_model_len

    assert launch_model_len(str(tiny_model), {}) == 4096  # the model's context
    assert launch_model_len(str(tiny_model), {"max_model_len": 512}) == 512
    assert launch_model_len(str(tiny_model), {"max_model_len": "8k"}) is None  # vLLM's to read: checked once served
    assert launch_model_len("org/not-here", {}) is None
