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

from ._engine import facts as facts
from ._engine.contract.body import check as check
from ._engine.contract.body import dims as dims
from ._engine.contract.decorator import Contract as Contract
from ._engine.contract.decorator import contract as contract
from ._engine.contract.decorator import registered_contracts as registered_contracts
from ._engine.errors import AnnotationError as AnnotationError
from ._engine.errors import ArgumentTypeError as ArgumentTypeError
from ._engine.errors import ContractError as ContractError
from ._engine.errors import DeviceError as DeviceError
from ._engine.errors import DtypeError as DtypeError
from ._engine.errors import LayoutError as LayoutError
from ._engine.errors import ShapeError as ShapeError
from ._engine.errors import ValueRangeError as ValueRangeError
from ._engine.errors import Violation as Violation
from ._engine.model.markers import MatchConfig as MatchConfig
from ._engine.model.markers import Range as Range
from ._engine.model.markers import Spec as Spec
from ._engine.model.markers import Where as Where
from ._engine.model.markers import config_dim_source as config_dim_source
from ._engine.model.markers import config_dims as config_dims
from ._engine.model.spec import CallContext as CallContext
from ._engine.model.spec import Dims as Dims
from ._engine.modes import get_mode as get_mode
from ._engine.modes import mode as mode
from ._engine.modes import set_default_mode as set_default_mode
from ._engine.op.backends import Backend as Backend
from ._engine.op.backends import BackendError as BackendError
from ._engine.op.opdef import Op as Op
from ._engine.op.opdef import op as op

# Last: the name ``ops`` is both this function and the package of the ops we ship, whose import
# above bound it to the package (which is callable too, as a fallback; see ops/__init__.py).
from ._engine.op.opdef import ops as ops
from ._engine.tools.docstrings import contract_docs as contract_docs
from ._engine.tools.docstrings import set_contract_docs as set_contract_docs
from ._engine.tools.dumps import save_call as save_call
from ._engine.tools.import_hook import ImportHook as ImportHook
from ._engine.tools.import_hook import ImportHookWarning as ImportHookWarning
from ._engine.tools.import_hook import install_import_hook as install_import_hook
from ._engine.version import __version__ as __version__
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
