"""Model configs the memory model and the roofline are checked on."""

# /work/shared/gpu/make_model.py: the Llama-3-8B shape served with --load-format dummy on the lent H200.
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}
