"""``with_functions``: the copy, the attributes and the normalization every rewrite relies on."""

from tvm.script import relax as R

from tvm_ollie.compat import relax, tvm
from tvm_ollie.transform.module_update import with_functions


@tvm.script.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
        with R.dataflow():
            y = R.add(x, x)
            R.output(y)
        return y


def _negated(func: relax.Function) -> relax.Function:
    """``main`` with its result negated, built without a type on the new binding."""
    x = func.params[0]
    y = relax.Var("y", relax.TensorType((2, 3), "float32"))
    z = relax.Var("z")  # no type: Normalize must deduce it
    block = relax.DataflowBlock([relax.VarBinding(y, relax.op.add(x, x)),
                                 relax.VarBinding(z, relax.op.negative(y))])
    return relax.Function(func.params, relax.SeqExpr([block], z), func.ret_ty)


def test_no_update_is_the_module_itself():
    mod = Module.with_attr("tag", "kept")
    assert with_functions(mod, {}) is mod


def test_updates_go_to_a_normalized_copy_with_the_attributes():
    mod = Module.with_attr("tag", "kept")
    gv = mod.get_global_var("main")
    new = with_functions(mod, {gv: _negated(mod[gv])})
    tvm.ir.assert_structural_equal(mod["main"], Module["main"])  # the caller's module untouched
    assert new.attrs["tag"] == "kept"
    z = new["main"].body.body
    assert isinstance(z.ty, relax.TensorType) and z.ty.ndim == 2
    assert [b.value.op.name for b in new["main"].body.blocks[0].bindings] == [
        "relax.add", "relax.negative"]
