"""Every kernel of the book, one ``*_forward`` / ``*_backward`` pair per equation (``F`` in the notebooks).

Convention: ``y, cache = name_forward(x, ...)`` and ``grads = name_backward(dy, cache)``, where
``grads`` holds one gradient per differentiable input, in the order of the forward's arguments
(a single array when there is one). The losses return ``(loss, dprediction)``. Each kernel lives in
its own file under ``tformer/kernels/``; this module only gathers them.
"""
from .kernels.activations import (gelu_backward, gelu_forward, relu_backward, relu_forward,
                                  sigmoid_backward, sigmoid_forward, swish_backward, swish_forward)
from .kernels.attention import (attention_backward, attention_forward, causal_mask,
                                create_padding_mask, merge_heads, padding_mask, split_heads)
from .kernels.dropout import dropout_backward, dropout_forward
from .kernels.embedding import embedding_backward, embedding_forward
from .kernels.flash_attention import flash_attention_backward, flash_attention_forward
from .kernels.layernorm import layernorm_backward, layernorm_forward
from .kernels.linear import linear_backward, linear_forward
from .kernels.losses import cross_entropy, mse_loss
from .kernels.positional import sinusoidal_positions
from .kernels.rmsnorm import rmsnorm_backward, rmsnorm_forward
from .kernels.rope import rope_angles, rope_backward, rope_forward
from .kernels.softmax import softmax_backward, softmax_forward
from .kernels.swiglu import swiglu_backward, swiglu_forward

__all__ = [
    "linear_forward", "linear_backward", "embedding_forward", "embedding_backward",
    "softmax_forward", "softmax_backward", "relu_forward", "relu_backward",
    "sigmoid_forward", "sigmoid_backward", "swish_forward", "swish_backward",
    "gelu_forward", "gelu_backward", "layernorm_forward", "layernorm_backward",
    "dropout_forward", "dropout_backward", "attention_forward", "attention_backward",
    "flash_attention_forward", "flash_attention_backward",
    "causal_mask", "padding_mask", "create_padding_mask", "split_heads", "merge_heads",
    "mse_loss", "cross_entropy", "sinusoidal_positions",
    "rmsnorm_forward", "rmsnorm_backward", "rope_forward", "rope_backward", "rope_angles",
    "swiglu_forward", "swiglu_backward",
]
