"""Published Hugging Face config.json values of models the converters and the planner read."""

# Published config.json values (the models' Hugging Face pages): Llama 3.1 8B (rope scaling
# llama3), Qwen3 0.6B (heads of 128 over a hidden size of 1024, tied, q/k norms), Qwen2.5 7B
# (q/k/v biases), Qwen3-30B-A3B (128 experts, top 8, renormalised), Gemma 3 1B (transformers 4's
# format: rope_local_base_freq and sliding_window_pattern; 999,885,952 parameters, as
# keras-hub's gemma3_1b preset states).
HF_CONFIGS = {
    "llama3.1-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336,
                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                        vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                        rope_theta=500000.0, tie_word_embeddings=False,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192}),
    "qwen3-0.6b": dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       vocab_size=152064, max_position_embeddings=131072, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, tie_word_embeddings=False),
    "qwen3-30b-a3b": dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144,
                          moe_intermediate_size=768, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                          decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936,
                          max_position_embeddings=40960, rms_norm_eps=1e-6,
                          rope_theta=1000000.0, tie_word_embeddings=False),
    "gemma3-1b": dict(model_type="gemma3_text", hidden_size=1152, intermediate_size=6912,
                      num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
                      head_dim=256, query_pre_attn_scalar=256, vocab_size=262144,
                      max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                      rope_local_base_freq=10000.0, rope_scaling=None, sliding_window=512,
                      sliding_window_pattern=6, hidden_activation="gelu_pytorch_tanh",
                      attn_logit_softcapping=None, final_logit_softcapping=None,
                      tie_word_embeddings=True),
}
