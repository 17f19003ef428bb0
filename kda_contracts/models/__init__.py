"""Model layers that use the contracts end to end (imported on demand: ``import kda_contracts``
does not load this package): the Kimi-Linear KDA layer and the Qwen3-Next GDN layer, both
decoding with continuous batching over slot-indexed state pools, tensor-parallel.

Example::

    from kda_contracts.models.kimi_linear import KimiDeltaAttention, random_weights

    layer = KimiDeltaAttention.from_hf_config("config.json", tp_size=2, tp_rank=0)
    layer.load_weights(**random_weights(layer.config, seed=0, rank=0))

    from kda_contracts.models import Qwen3NextGatedDeltaNet
    gdn = Qwen3NextGatedDeltaNet.from_hf_config("qwen3-next/config.json", tp_size=2, tp_rank=1)
"""

from .kimi_linear import WEIGHT_NAMES as WEIGHT_NAMES
from .kimi_linear import KimiDeltaAttention as KimiDeltaAttention
from .kimi_linear import layer_dims as layer_dims
from .kimi_linear import random_weights as random_weights
from .kimi_linear import shard_weights as shard_weights
from .linear_attention import LinearAttentionDecode as LinearAttentionDecode
from .qwen3_next import Qwen3NextGatedDeltaNet as Qwen3NextGatedDeltaNet
