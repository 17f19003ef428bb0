"""kda-contracts: explicit, enforced contracts for KDA packed-decode kernels.

Example::

    import kda_contracts as kc
    cfg = kc.KDAConfig.preset("kimi-linear-48b-a3b", tp_size=2)
    dims = kc.validate_packed_decode(mixed_qkv, a, b, A_log, dt_bias, cfg.scale, state, out, idx,
                                     True, config=cfg)
    out, state = kc.packed_decode(mixed_qkv, a, b, A_log, dt_bias, cfg.scale, state, out, idx,
                                  True, config=cfg)

Nothing here imports triton, helion or fla: backends load when they are asked for.
"""

from jaxtyping import Float as Float
from jaxtyping import Int as Int
from jaxtyping import Shaped as Shaped
from torch import Tensor as Tensor

from . import facts as facts
from .backends import Backend as Backend
from .backends import BackendError as BackendError
from .body import check as check
from .body import dims as dims
from .decorator import Contract as Contract
from .decorator import contract as contract
from .decorator import registered_contracts as registered_contracts
from .docstrings import contract_docs as contract_docs
from .docstrings import set_contract_docs as set_contract_docs
from .dumps import save_call as save_call
from .errors import AnnotationError as AnnotationError
from .errors import ArgumentTypeError as ArgumentTypeError
from .errors import ContractError as ContractError
from .errors import DeviceError as DeviceError
from .errors import DtypeError as DtypeError
from .errors import LayoutError as LayoutError
from .errors import ShapeError as ShapeError
from .errors import ValueRangeError as ValueRangeError
from .errors import Violation as Violation
from .import_hook import ImportHook as ImportHook
from .import_hook import ImportHookWarning as ImportHookWarning
from .import_hook import install_import_hook as install_import_hook
from .markers import MatchConfig as MatchConfig
from .markers import Range as Range
from .markers import Spec as Spec
from .markers import Where as Where
from .markers import config_dim_source as config_dim_source
from .markers import config_dims as config_dims
from .modes import get_mode as get_mode
from .modes import mode as mode
from .modes import set_default_mode as set_default_mode
from .opdef import Op as Op
from .opdef import op as op

# Last: the name ``ops`` is both this function and the package of the ops we ship, whose import
# above bound it to the package (which is callable too, as a fallback; see ops/__init__.py).
from .opdef import ops as ops
from .ops.gdn_decode import GDN_PRESETS as GDN_PRESETS
from .ops.gdn_decode import GDNConfig as GDNConfig
from .ops.gdn_decode import gdn_packed_decode as gdn_packed_decode
from .ops.gdn_decode import validate_gdn_packed_decode as validate_gdn_packed_decode
from .ops.packed_decode import PRESETS as PRESETS
from .ops.packed_decode import KDAConfig as KDAConfig
from .ops.packed_decode import adapters as adapters
from .ops.packed_decode import explain_backends as explain_backends
from .ops.packed_decode import packed_decode as packed_decode
from .ops.packed_decode import packed_decode_contract as packed_decode_contract
from .ops.packed_decode import validate_packed_decode as validate_packed_decode
from .spec import CallContext as CallContext
from .spec import Dims as Dims

__version__ = "0.1.0.dev0"
