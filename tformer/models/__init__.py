"""The five source systems, one file each (see ``shared/seeds``), and the first chapter's model.

| class | seed | file |
| --- | --- | --- |
| ``AttentionLayer`` | 001 | ``attention_layer.py`` |
| ``TwoLayerTransformer`` | 000 | ``two_layer.py`` |
| ``Transformer`` | 002 | ``transformer.py`` |
| ``Encoder`` | 003 | ``encoder.py`` |
| ``TinyGPT`` | 004 | ``tinygpt.py`` |

``OneHeadLM`` (``one_head.py``) is no source system: the whole picture of the first chapter, a
byte-level language model with one causal attention head.
"""
from .attention_layer import AttentionLayer
from .encoder import Encoder
from .one_head import OneHeadLM
from .tinygpt import TinyGPT
from .transformer import Transformer
from .two_layer import TwoLayerTransformer

__all__ = ["AttentionLayer", "TwoLayerTransformer", "Transformer", "Encoder", "TinyGPT", "OneHeadLM"]
