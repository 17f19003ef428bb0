"""kda-contracts: runtime contracts for any PyTorch kernel or model function.

A function's jaxtyping annotations (``Float[Tensor, "B T H D"]``, plus ``kc.Spec``, ``kc.Range``,
``where=``) are its contract: ``@kc.contract`` checks every call's shapes, dtypes, devices and
layouts (strides) fast enough to leave on, and a broken call raises a ``kc.ContractError`` that
names each violation, where every dim came from and, for known mistakes, the fix. A config (a
pydantic model or dataclass) can fix dims; ``kc.op`` sends a validated call to the best of its
pluggable kernels (Triton, Helion, the torch reference); ``kc.save_call`` dumps a failing call;
``kda-contracts docs`` renders the contracts as shape docs. KDA (Kimi-Linear) and GDN (Qwen3-Next)
packed decode and varlen prefill ship as ops built on the same public API (``kc.packed_decode``,
``kc.gdn_packed_decode``, ``kc.packed_prefill``, ``kc.gdn_packed_prefill``).

Example::

    import torch
    import kda_contracts as kc
    from kda_contracts import Float, Tensor

    @kc.contract
    def project(x: Float[Tensor, "*batch D"], w: Float[Tensor, "D E"]) -> Float[Tensor, "*batch E"]:
        return x @ w

    project(torch.zeros(2, 8, 16), torch.zeros(16, 4))     # fine
    project(torch.zeros(2, 8, 16), torch.zeros(12, 4))     # kc.ShapeError, naming w:
    # dim 0 (D): expected 16 (D from x.shape[-1]), got 12

Nothing here imports triton, helion or fla: backends load when they are asked for.
"""

from jaxtyping import Bool as Bool
from jaxtyping import Float as Float
from jaxtyping import Int as Int
from jaxtyping import Shaped as Shaped
from torch import Tensor as Tensor

from ._engine import PUBLIC as _ENGINE_PUBLIC
from ._engine import AnnotationError as AnnotationError
from ._engine import ArgumentTypeError as ArgumentTypeError
from ._engine import Backend as Backend
from ._engine import BackendError as BackendError
from ._engine import CallContext as CallContext
from ._engine import ConfigError as ConfigError
from ._engine import Contract as Contract
from ._engine import ContractError as ContractError
from ._engine import DeviceError as DeviceError
from ._engine import Dims as Dims
from ._engine import Distinct as Distinct
from ._engine import DtypeError as DtypeError
from ._engine import EndsAt as EndsAt
from ._engine import Finite as Finite
from ._engine import FiniteRows as FiniteRows
from ._engine import ImportHook as ImportHook
from ._engine import ImportHookWarning as ImportHookWarning
from ._engine import InRange as InRange
from ._engine import LayoutError as LayoutError
from ._engine import MatchConfig as MatchConfig
from ._engine import NonDecreasing as NonDecreasing
from ._engine import Op as Op
from ._engine import Range as Range
from ._engine import ShapeError as ShapeError
from ._engine import Spec as Spec
from ._engine import StartsAt as StartsAt
from ._engine import ValueRangeError as ValueRangeError
from ._engine import ValueRule as ValueRule
from ._engine import Violation as Violation
from ._engine import Where as Where
from ._engine import __version__ as __version__
from ._engine import check as check
from ._engine import config_dim_source as config_dim_source
from ._engine import config_dims as config_dims
from ._engine import contract as contract
from ._engine import contract_docs as contract_docs
from ._engine import dims as dims
from ._engine import facts as facts
from ._engine import get_mode as get_mode
from ._engine import install_import_hook as install_import_hook
from ._engine import mode as mode
from ._engine import op as op
from ._engine import ops as ops  # (rebound below to the package of the ops we ship, which answers the call too)
from ._engine import raise_pending as raise_pending
from ._engine import registered_contracts as registered_contracts
from ._engine import save_call as save_call
from ._engine import set_contract_docs as set_contract_docs
from ._engine import set_default_mode as set_default_mode
from .ops.gdn_decode import GDN_PRESETS as GDN_PRESETS
from .ops.gdn_decode import GDNConfig as GDNConfig
from .ops.gdn_decode import gdn_packed_decode as gdn_packed_decode
from .ops.gdn_decode import validate_gdn_packed_decode as validate_gdn_packed_decode
from .ops.gdn_prefill import gdn_packed_prefill as gdn_packed_prefill
from .ops.gdn_prefill import validate_gdn_packed_prefill as validate_gdn_packed_prefill
from .ops.packed_decode import PRESETS as PRESETS
from .ops.packed_decode import KDAConfig as KDAConfig
from .ops.packed_decode import adapters as adapters
from .ops.packed_decode import explain_backends as explain_backends
from .ops.packed_decode import packed_decode as packed_decode
from .ops.packed_decode import packed_decode_contract as packed_decode_contract
from .ops.packed_decode import validate_packed_decode as validate_packed_decode
from .ops.packed_prefill import packed_prefill as packed_prefill
from .ops.packed_prefill import validate_packed_prefill as validate_packed_prefill

__all__ = [
    "Bool", "Float", "Int", "Shaped", "Tensor", "__version__", *_ENGINE_PUBLIC,
    # the ops we ship
    "GDN_PRESETS", "PRESETS", "GDNConfig", "KDAConfig", "adapters", "explain_backends", "gdn_packed_decode",
    "gdn_packed_prefill", "packed_decode", "packed_decode_contract", "packed_prefill", "validate_gdn_packed_decode",
    "validate_gdn_packed_prefill", "validate_packed_decode", "validate_packed_prefill",
]
