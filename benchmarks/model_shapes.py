"""The real architectures the GPU benchmarks build with random weights (speed does not depend on
the weights' values), in one place: Qwen2 config keyword arguments, tied embeddings implied."""

QWEN2_5_0_5B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                    num_key_value_heads=2, vocab_size=151936)
QWEN2_5_1_5B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                    num_key_value_heads=2, vocab_size=151936)
