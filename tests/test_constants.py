"""LiftConstants: tensor constants become parameters, scalars stay as kernel literals."""

import numpy as np
import tvm
from tvm import relax

import relax_cutlass
from relax_cutlass.kinds.ir import is_scalar_constant
from relax_cutlass.prepare import bind_weights
from relax_cutlass.stages.constants import composite_of, offloaded_functions
from relax_cutlass.testing.models import dense_epilogue_model, random_weights
from relax_cutlass.transform import LiftConstants, PartitionForCutlass


def constants_in(expr):
    found = []
    relax.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, tvm.ir.GenericConst) else None)
    return found


def lifted(mod):
    return LiftConstants()(PartitionForCutlass()(mod))


def bound_model(**kwargs):
    mod = dense_epilogue_model(64, 32, 16, **kwargs)
    return bind_weights(mod, random_weights(mod))


def test_tensor_constants_become_parameters_and_scalars_stay():
    mod = lifted(bound_model(activation="gelu_decomposed", residual=True))
    ((_, func),) = offloaded_functions(mod)
    composite = composite_of(func)
    consts = constants_in(composite.body)
    assert consts and all(is_scalar_constant(c) for c in consts)  # 0.5, 1/sqrt(2), 1.0 remain
    assert len(func.params) == len(composite.params) == 4  # x, residual, weight, bias
    assert not constants_in(func.body.blocks[0].bindings[1].value)  # the call passes params only
    # The caller now passes the weight and bias.
    call_consts = [c for c in constants_in(mod["main"].body) if not is_scalar_constant(c)]
    assert sorted(tuple(c.value.shape) for c in call_consts) == [(16, 32), (32,)]


def test_lifting_is_idempotent_and_a_noop_without_constants():
    mod = lifted(bound_model(activation="relu"))
    again = LiftConstants()(mod)
    tvm.ir.assert_structural_equal(mod, again)
    unbound = PartitionForCutlass()(dense_epilogue_model(64, 32, 16, activation="relu"))
    tvm.ir.assert_structural_equal(unbound, LiftConstants()(unbound))


def test_generated_sources_never_contain_weights():
    """Two models differing only in weight values generate byte-identical C++."""
    from relax_cutlass.stages.codegen import CodegenOptions, plan_regions
    from relax_cutlass.stages.emit import emit_glue, emit_kernel

    def sources(seed):
        mod = dense_epilogue_model(64, 32, 16, activation="gelu")
        mod = lifted(bind_weights(mod, random_weights(mod, seed=seed)))
        regions = plan_regions([f for _, f in offloaded_functions(mod)], CodegenOptions())
        return [emit_kernel(r.kernel).text for r in regions] + [emit_glue(regions, "m").text]

    a, b = sources(0), sources(1)
    assert a == b
    weights = random_weights(dense_epilogue_model(64, 32, 16), seed=0)["w"]
    assert all(f"{float(weights.flat[0]):.4f}" not in text for text in a)


def test_lifted_module_computes_the_same_on_cpu():
    from relax_cutlass.testing.harness import compare_on_cpu, random_inputs

    mod = bound_model(activation="gelu_decomposed", residual=True, residual_relu=True)
    compare_on_cpu(mod, random_inputs(mod))


def test_shared_weight_used_by_two_regions():
    """One constant feeding two offloaded regions is lifted into each of them."""
    w = np.random.default_rng(0).uniform(-1, 1, (32, 32)).astype("float16")
    x = relax.Var("x", relax.TensorType([8, 32], "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            c = relax.const(w)
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.matmul(x, c))))
            out = bb.emit_output(bb.emit(relax.op.matmul(y, c)))
        bb.emit_func_output(out)
    mod = bb.get()
    assert len(list(offloaded_functions(lifted(mod)))) == 2
    from relax_cutlass.testing.harness import compare_on_cpu, random_inputs

    compare_on_cpu(mod, random_inputs(mod))
    assert relax_cutlass.offload_report(mod).offloaded
