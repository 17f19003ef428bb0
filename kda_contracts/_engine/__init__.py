"""The engine: general, it knows nothing of KDA. This module is its API, in two parts.

- :data:`PUBLIC`: what ``kda_contracts`` re-exports for users (``kc.contract``, ``kc.op``, the
  markers, the errors, the modes, ...).
- The extension points the ops we ship build on, beside that: the docs generator's sections,
  the command line's commands, the dump formats ``kda-contracts validate`` reads, the memory
  helpers value checks use. An op imports the engine from here and nowhere deeper, so the
  engine's inner modules can move without touching an op.

The data path, one way, through the engine's folders: an annotation is read (``reading``) into
a spec of plain data types (``model``, over the dim ``grammar`` and the ``rules``), the spec is
generated into a checker (``codegen``), a rejected call is worded by the explainer (``explain``),
a contracted function runs through its wrapper and strict mode's transaction (``contract``),
an op dispatches to a backend (``op``); ``compile`` is the torch.compile glue and ``tools`` (the
command line, docs, dumps, the pytest plugin, the import hook) listen to the core through
``hooks``.

Example::

    from kda_contracts import _engine as engine

    @engine.op
    def scale_rows(x: Float[Tensor, "B D"], out: Annotated[Float[Tensor, "B D"], engine.Spec(mutated=True)]) -> None:
        out.copy_(2 * x)
"""

import importlib
from typing import Any

from . import facts as facts
from .contract.body import check as check
from .contract.body import dims as dims
from .contract.compiled import Contract as Contract
from .contract.decorator import contract as contract
from .contract.decorator import registered_contracts as registered_contracts
from .contract.watch import raise_pending as raise_pending
from .errors import AnnotationError as AnnotationError
from .errors import ArgumentTypeError as ArgumentTypeError
from .errors import ConfigError as ConfigError
from .errors import ContractError as ContractError
from .errors import DeviceError as DeviceError
from .errors import DtypeError as DtypeError
from .errors import LayoutError as LayoutError
from .errors import ShapeError as ShapeError
from .errors import ValueRangeError as ValueRangeError
from .errors import Violation as Violation
from .errors import format_report as format_report
from .errors import raise_violations as raise_violations
from .grammar.dims import Expr as Expr
from .grammar.dims import Sym as Sym
from .model.markers import MatchConfig as MatchConfig
from .model.markers import Range as Range
from .model.markers import Spec as Spec
from .model.markers import Where as Where
from .model.markers import config_dim_source as config_dim_source
from .model.markers import config_dims as config_dims
from .model.spec import CallContext as CallContext
from .model.spec import Dims as Dims
from .modes import get_mode as get_mode
from .modes import mode as mode
from .modes import set_default_mode as set_default_mode
from .operation.backends import Backend as Backend
from .operation.backends import BackendError as BackendError
from .operation.backends import CallInfo as CallInfo
from .operation.decorate import op as op
from .operation.opdef import Op as Op
from .operation.registry import load_plugins as load_plugins
from .operation.registry import ops as ops
from .rules.memory import FINITE_CHUNK as FINITE_CHUNK
from .rules.memory import distinct_elements as distinct_elements
from .rules.memory import skip_value_checks as skip_value_checks
from .rules.memory import without_data as without_data
from .rules.values import Distinct as Distinct
from .rules.values import EndsAt as EndsAt
from .rules.values import Finite as Finite
from .rules.values import FiniteRows as FiniteRows
from .rules.values import InRange as InRange
from .rules.values import NonDecreasing as NonDecreasing
from .rules.values import StartsAt as StartsAt
from .rules.values import ValueRule as ValueRule
from .tools.docstrings import contract_docs as contract_docs
from .tools.docstrings import set_contract_docs as set_contract_docs
from .tools.dumps import save_call as save_call
from .tools.import_hook import ImportHook as ImportHook
from .tools.import_hook import ImportHookWarning as ImportHookWarning
from .tools.import_hook import install_import_hook as install_import_hook
from .version import __version__ as __version__

# The extension points of the tools (docs generator, command line, dump reader), imported when first
# asked for: ``import kda_contracts`` does not load them (name: (module, attribute)).
_LAZY = {
    'Command': ('.tools.cli', 'Command'),
    'CommandError': ('.tools.cli', 'CommandError'),
    'DO_NOT_EDIT': ('.tools.docs', 'DO_NOT_EDIT'),
    'DocsSource': ('.tools.cli', 'DocsSource'),
    'DumpError': ('.tools.dump_reader', 'DumpError'),
    'DumpFormat': ('.tools.cli', 'DumpFormat'),
    'GENERATED_MARK': ('.tools.docs', 'GENERATED_MARK'),
    'LoadedFile': ('.tools.dump_reader', 'LoadedFile'),
    'ModulePage': ('.tools.module_docs', 'ModulePage'),
    'Section': ('.tools.docs', 'Section'),
    'cell': ('.tools.docs', 'cell'),
    'describe_constraints': ('.tools.docs', 'describe_constraints'),
    'describe_contract': ('.tools.docs', 'describe_contract'),
    'describe_contracts': ('.tools.docs', 'describe_contracts'),
    'describe_op': ('.tools.module_docs', 'describe_op'),
    'docs_command': ('.tools.cli', 'docs_command'),
    'load_file': ('.tools.dump_reader', 'load_file'),
    'mark_svg': ('.tools.docs', 'mark_svg'),
    'op_section': ('.tools.module_docs', 'op_section'),
    'render_reference': ('.tools.docs', 'render_reference'),
    'run_command_line': ('.tools.cli', 'main'),
    'slug': ('.tools.docs', 'slug'),
    'validate_command': ('.tools.cli', 'validate_command'),
    'write_docs': ('.tools.docs', 'write'),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module, __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: what ``kda_contracts`` re-exports for users
PUBLIC = (
    "AnnotationError", "ArgumentTypeError", "Backend", "BackendError", "CallContext", "ConfigError", "Contract",
    "ContractError", "DeviceError", "Dims", "Distinct", "DtypeError", "EndsAt", "Finite", "FiniteRows", "ImportHook",
    "ImportHookWarning", "InRange", "LayoutError", "MatchConfig", "NonDecreasing", "Op", "Range", "ShapeError",
    "Spec", "StartsAt", "ValueRangeError", "ValueRule", "Violation", "Where", "check", "config_dim_source",
    "config_dims", "contract", "contract_docs", "dims", "facts", "get_mode", "install_import_hook", "mode", "op",
    "ops", "raise_pending", "registered_contracts", "save_call", "set_contract_docs", "set_default_mode",
)

__all__ = [
    *PUBLIC,
    # extension points for the ops we ship (and yours): docs, command line, dumps, value checks
    "DO_NOT_EDIT", "FINITE_CHUNK", "GENERATED_MARK", "CallInfo", "Command", "CommandError", "DocsSource",
    "DumpError", "DumpFormat", "Expr", "LoadedFile", "ModulePage", "Section", "Sym", "__version__", "cell",
    "describe_constraints", "describe_contract", "describe_contracts", "describe_op", "distinct_elements",
    "docs_command", "format_report", "load_file", "load_plugins", "mark_svg", "op_section", "raise_violations",
    "render_reference", "run_command_line", "skip_value_checks", "slug", "validate_command", "without_data",
    "write_docs",
]
