"""The book's five systems, one file each, and the first chapter's model.

| class | system | file |
| --- | --- | --- |
| ``AttentionLayer`` | the single attention layer | ``attention_layer.py`` |
| ``TwoLayerTransformer`` | the two-layer transformer | ``two_layer.py`` |
| ``Transformer`` | the complete Transformer (decoder-only) | ``transformer.py`` |
| ``Encoder`` | the post-LN encoder | ``encoder.py`` |
| ``TinyGPT`` | TinyGPT, a byte-level GPT | ``tinygpt.py`` |

``OneHeadLM`` (``one_head.py``) is none of the five: the whole picture of the first chapter, a
byte-level language model with one causal attention head.
"""
from .attention_layer import AttentionLayer
from .encoder import Encoder
from .one_head import OneHeadLM
from .tinygpt import TinyGPT
from .transformer import Transformer
from .two_layer import TwoLayerTransformer

__all__ = ["AttentionLayer", "TwoLayerTransformer", "Transformer", "Encoder", "TinyGPT", "OneHeadLM"]
