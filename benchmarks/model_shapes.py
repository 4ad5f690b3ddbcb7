"""The real architectures the GPU benchmarks build with random weights (speed does not depend on
the weights' values), in one place: Qwen2 config keyword arguments. Embeddings are tied unless a
shape says ``tie_word_embeddings=False`` (Qwen2.5-7B); build configs with :func:`config_kwargs`."""

# SmolLM2-135M-Instruct (a Llama; as a Qwen2 config only the q/k/v biases differ): the real model of
# the CPU quickstart and the learning checks, for speed at the size those run at.
SMOLLM2_135M = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
)
QWEN2_5_0_5B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
)
QWEN2_5_1_5B = dict(
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
)
QWEN2_5_3B = dict(
    hidden_size=2048,
    intermediate_size=11008,
    num_hidden_layers=36,
    num_attention_heads=16,
    num_key_value_heads=2,
    vocab_size=151936,
)
QWEN2_5_7B = dict(
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    tie_word_embeddings=False,
)


def config_kwargs(shape: dict, **extra) -> dict:
    """Qwen2Config keyword arguments for ``shape``: tied embeddings by default, then ``extra``."""
    return {"tie_word_embeddings": True, **shape, **extra}


def layer_products(shape: dict) -> dict[str, tuple[int, int]]:
    """The weight shape (N, K) of each matrix product of one decoder layer, apart and fused as the
    ``hf`` engine runs them (q/k/v as one, gate/up as one), and of the lm_head."""
    hidden, inter, heads, kv_heads = (
        shape["hidden_size"],
        shape["intermediate_size"],
        shape["num_attention_heads"],
        shape["num_key_value_heads"],
    )
    head_dim = hidden // heads
    return {
        "q": (heads * head_dim, hidden),
        "k": (kv_heads * head_dim, hidden),
        "v": (kv_heads * head_dim, hidden),
        "o": (hidden, heads * head_dim),
        "gate": (inter, hidden),
        "up": (inter, hidden),
        "down": (hidden, inter),
        "qkv fused": ((heads + 2 * kv_heads) * head_dim, hidden),
        "gate+up fused": (2 * inter, hidden),
        "lm_head": (shape["vocab_size"], hidden),
    }
