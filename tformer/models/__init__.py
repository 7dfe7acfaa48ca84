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
from tformer.models.attention_layer import AttentionLayer
from tformer.models.encoder import Encoder
from tformer.models.one_head import OneHeadLM
from tformer.models.tinygpt import TinyGPT
from tformer.models.transformer import Transformer
from tformer.models.two_layer import TwoLayerTransformer

__all__ = ["AttentionLayer", "TwoLayerTransformer", "Transformer", "Encoder", "TinyGPT", "OneHeadLM"]
