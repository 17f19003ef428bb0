"""Shape tables in docstrings: ``kc.contract(doc=True)``, ``kc.set_contract_docs`` and
``$KDA_CONTRACTS_DOC``; the table is the one ``kda-contracts docs`` renders, in a reST literal
block, and is only rendered for contracts that ask for it."""

import os
import pydoc
import subprocess
import sys
from typing import Annotated

import pytest
import torch

import kda_contracts as kc
from kda_contracts import Float, Tensor
from kda_contracts._engine.tools.docs import describe_contract, render_contract
from kda_contracts._engine.tools.docstrings import HEADING, SUMMARY

PROJECT_DOC = """Project x onto w.

Both on one device.

Contract (kda-contracts)::

    Config: none: every dim comes from the arguments.

    | argument | shape | dtypes | layout |
    |---|---|---|---|
    | `x` | `[*batch, D]` | float32 | any strides |
    | `w` | `[D, E]` | float32 | contiguous: strides `[E, 1]` |

    Where each dim is bound from (the first source binds it; every other appearance is checked against it):

    | dim | bound | appears in |
    |---|---|---|
    | `*batch` | from x.shape[:-1] | x.shape[:-1] |
    | `D` | from x.shape[-1] | x.shape[-1], w.shape[0] |
    | `E` | from w.shape[1] | w.shape[1] |

    Cross-argument constraints:

    - `E >= D` (ShapeError; checked per call)
    - every tensor on the device of `x` (DeviceError)

    Returns: `return` `[*batch, E]` (float32)"""

F32 = kc.Spec(dtypes=(torch.float32,))


@pytest.fixture(autouse=True)
def docs_setting_restored():
    previous = kc.set_contract_docs(False)
    yield
    kc.set_contract_docs(previous)


def project(x: Annotated[Float[Tensor, "*batch D"], F32],
            w: Annotated[Float[Tensor, "D E"], kc.Spec(dtypes=(torch.float32,), contiguous=True)],
            ) -> Annotated[Float[Tensor, "*batch E"], F32]:
    """Project x onto w.

    Both on one device.
    """
    return x @ w


def block_of(doc):
    """The lines of the literal block under the heading."""
    return doc.split(HEADING + "\n\n", 1)[1].splitlines()


# -- what the docstring says ----------------------------------------------------------------------
def test_doc_true_appends_the_rendered_table_to_the_wrappers_docstring():
    f = kc.contract(project, doc=True, register=False, where=["E >= D"])
    assert f.__doc__ == PROJECT_DOC
    assert f(torch.ones(2, 3, 4), torch.ones(4, 5)).shape == (2, 3, 5)  # and it still checks
    with pytest.raises(kc.ShapeError):
        f(torch.ones(2, 4), torch.ones(3, 5))


def test_the_table_is_what_the_docs_generator_renders_for_the_contract():
    f = kc.contract(project, doc=True, register=False)
    c = f.__kda_contract__
    rendered = render_contract(describe_contract(c.name, c, None), heading=False, errors_page=None)
    assert block_of(f.__doc__) == [f"    {line}" if line else "" for line in rendered[:-1]]
    assert rendered[-1] == ""


def test_the_wrapped_functions_own_docstring_is_left_alone():
    before = project.__doc__
    kc.contract(project, doc=True, register=False)
    assert project.__doc__ == before


def test_a_function_without_a_docstring_gets_a_summary_line_first():
    @kc.contract(doc=True, register=False)
    def f(x: Float[Tensor, "B"]) -> None: ...

    assert f.__doc__.startswith(f"{SUMMARY}\n\n{HEADING}\n\n    Config: none")


def test_help_shows_the_table_as_an_indented_literal_block():
    f = kc.contract(project, doc=True, register=False)
    text = pydoc.render_doc(f, renderer=pydoc.plaintext)
    assert "    Contract (kda-contracts)::\n    \n        Config: none" in text
    assert "        | `w` | `[D, E]` | float32 | contiguous" in text


def test_every_line_of_the_block_is_indented_so_sphinx_reads_it_verbatim():
    # reST would read a `|---|` line outside a literal block as a substitution reference
    f = kc.contract(project, doc=True, register=False)
    lines = block_of(f.__doc__)
    assert lines and all(line.startswith("    ") or not line for line in lines)
    assert f.__doc__.count("::") == 1


def test_strict_value_checks_are_named_without_a_link_to_the_generated_catalogue():
    def no_negatives(ctx):
        """Strict mode: x has no negative value."""
        return []

    @kc.contract(doc=True, register=False, value_checks=no_negatives)
    def f(x: Float[Tensor, "B"]) -> None: ...

    assert "also runs the contract's value checks: x has no negative value." in f.__doc__
    assert "errors.md" not in f.__doc__


def test_without_doc_the_docstring_is_the_functions():
    assert kc.contract(project, register=False).__doc__ == project.__doc__


def test_a_contract_decorated_while_off_is_the_function_itself_with_its_docstring():
    with kc.mode("off"):
        f = kc.contract(project, doc=True, register=False)
    assert f is project and HEADING not in project.__doc__


# -- methods and classes ------------------------------------------------------------------------------
def test_methods_get_their_own_table_and_the_class_names_them():
    @kc.contract(doc=True)
    class Layer(torch.nn.Module):
        """A layer."""

        def forward(self, x: Float[Tensor, "B D"]) -> Float[Tensor, "B D"]:
            """Forward."""
            return x

        @staticmethod
        def pad(x: Float[Tensor, "N"]) -> Float[Tensor, "N+1"]:
            return torch.cat([x, x[:1]])

        def size(self) -> int:
            return 1

    assert Layer.__doc__ == ("A layer.\n\nContracted methods (kda-contracts): ``forward``, ``pad``; each method's "
                             "docstring has its shape table.")
    assert Layer.forward.__doc__.startswith(f"Forward.\n\n{HEADING}\n\n")
    assert "| `x` | `[B, D]` |" in Layer.forward.__doc__
    assert "| `x` | `[N]` |" in Layer.pad.__doc__
    assert Layer.size.__doc__ is None
    assert Layer()(torch.ones(2, 3)).shape == (2, 3)


def test_a_method_decorated_by_hand_gets_its_table():
    class Layer:
        @kc.contract(doc=True, register=False)
        def forward(self, x: Float[Tensor, "B D"]) -> None: ...

    assert "| `x` | `[B, D]` |" in Layer.forward.__doc__


def test_a_class_decorated_without_doc_keeps_its_docstrings():
    @kc.contract
    class Layer:
        """A layer."""

        def forward(self, x: Float[Tensor, "B D"]) -> None:
            """Forward."""

    assert (Layer.__doc__, Layer.forward.__doc__) == ("A layer.", "Forward.")


# -- the process setting ------------------------------------------------------------------------------
def test_set_contract_docs_applies_to_contracts_decorated_afterwards_and_returns_the_previous_setting():
    plain = kc.contract(project, register=False)
    assert kc.set_contract_docs(True) is False
    documented = kc.contract(project, register=False)
    assert kc.contract_docs() is True
    assert HEADING not in plain.__doc__ and HEADING in documented.__doc__
    assert HEADING not in kc.contract(project, doc=False, register=False).__doc__  # doc= wins
    assert kc.set_contract_docs(False) is True


def test_set_contract_docs_takes_a_bool():
    with pytest.raises(kc.AnnotationError, match=r"kc.set_contract_docs: expected True or False, got 'yes'"):
        kc.set_contract_docs("yes")


SCRIPT = """
import sys, warnings
warnings.simplefilter("always")
import kda_contracts as kc
from kda_contracts import Float, Tensor

@kc.contract
def f(x: Float[Tensor, "B"]) -> None: ...

print(kc.contract_docs(), "Contract (kda-contracts)::" in (f.__doc__ or ""),
      "kda_contracts._engine.tools.docs" in sys.modules)
"""


def run_script(env_value):
    env = {**os.environ, "KDA_CONTRACTS_DOC": env_value}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.parametrize("value", ["1", "true", " ON "])
def test_the_environment_variable_turns_the_tables_on(value):
    assert run_script(value).stdout.split() == ["True", "True", "True"]


@pytest.mark.parametrize("value", ["", "0", "off"])
def test_without_the_variable_nothing_is_rendered_and_the_docs_module_is_not_imported(value):
    done = run_script(value)
    assert done.stdout.split() == ["False", "False", "False"]
    assert "KDA_CONTRACTS_DOC" not in done.stderr


def test_a_value_naming_neither_on_nor_off_is_a_warning_not_silence():
    done = run_script("maybe")
    assert done.stdout.split() == ["False", "False", "False"]
    assert ("RuntimeWarning: KDA_CONTRACTS_DOC='maybe' is neither on (1, true, yes, on) nor off (empty, 0, false, "
            "no, off); contracts get no shape table in their docstrings") in done.stderr


def test_container_arguments_are_documented_and_the_dims_they_bind_have_a_source():
    # they were left out: the table listed bias only, and B had no source and appeared nowhere
    @kc.contract(doc=True, register=False)
    def stack_heads(heads: list[Float[Tensor, "B D"]], bias: Float[Tensor, "D"]) -> Float[Tensor, "B D"]:
        """Sum the heads and add a bias."""
        return sum(heads) + bias

    doc = stack_heads.__doc__
    assert "| `heads` | `list[Tensor[B D]]` | every tensor inside, against the call's dims |" in doc
    assert "| `B` | from the tensors inside heads | every tensor inside heads |" in doc
    assert "| `D` | from bias.shape[0] | bias.shape[0], every tensor inside heads |" in doc


def test_an_op_gets_the_table_of_each_variant_with_doc_true_or_the_process_setting():
    def body(x: Float[Tensor, "B D"], w: Float[Tensor, "D"]) -> Float[Tensor, "B D"]:
        """Scale each row of x by w."""
        return x * w

    assert kc.op(body, name="doc_off_op").__doc__ == "Scale each row of x by w."  # (the setting is off here)
    scale = kc.op(body, name="doc_on_op", doc=True)
    assert scale.__doc__.startswith(f"Scale each row of x by w.\n\n{HEADING}\n\n    Config: none")
    assert "    | `w` | `[D]` | bfloat16, float16, float32, float64, any float8 | any strides |" in scale.__doc__
    kc.set_contract_docs(True)
    assert HEADING in kc.op(body, name="doc_setting_op").__doc__

    def wide(x: Float[Tensor, "B 2*D"], w: Float[Tensor, "D"]) -> None: ...

    def narrow(x: Float[Tensor, "B D"], w: Float[Tensor, "D"]) -> None: ...

    def plain(x, w):
        """Scale x."""
        return x * w

    both = kc.op(plain, name="doc_variants_op", variants={"wide": wide, "narrow": narrow},
                 variant=lambda x, w: "wide" if x.shape[1] == 2 * w.shape[0] else "narrow")
    lines = both.__doc__.splitlines()
    assert "    Variant ``wide``:" in lines and "    Variant ``narrow``:" in lines
    assert "    | `x` | `[B, 2*D]` | bfloat16, float16, float32, float64, any float8 | any strides |" in lines
