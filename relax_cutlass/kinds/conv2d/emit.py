"""C++ of the conv2d kind: cutlass_library's `EmitConv2dInstance` (`ImplicitGemmConvolution` over
`DefaultConv2dFprop`, or `DefaultConv2dGroupFprop` for grouped convs), or
`DefaultConv2dFpropWithBroadcast` for residual blocks; the CUTLASS 3.x kernels (emit_3x.py); and a
region's glue function."""

from __future__ import annotations

from string import Template

from ...cutlass_lib import data_type
from ...cutlass_lib import load as load_cutlass_library
from ...toolkit.compile import Source
from ...toolkit.glue import residual_checks, role_aliases, tensor_checks
from ..cutlass_device import activation_prefix, device_kernel_source, residual_block_values, sm80_description
from ..nhwc import conv_glue_values
from .emit_3x import conv2d_3x_kernel_parts
from .records import Conv2dKernel, Conv2dRegion
from .templates import ARGS_TYPE, CONV2D_ARGS, CONV2D_ARGUMENTS, CONV2D_GLUE_FUNCTION, CONV2D_RESIDUAL_ARGUMENTS

CONV2D_INCLUDES = """\
#include "cutlass/numeric_types.h"
#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/conv/kernel/default_conv2d_fprop.h"
#include "cutlass/conv/kernel/default_conv2d_fprop_with_broadcast.h"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/epilogue/thread/linear_combination_generic.h"
#include "cutlass/epilogue/thread/linear_combination_residual_block.h"
"""
GROUP_FPROP_INCLUDE = '#include "cutlass/conv/kernel/default_conv2d_group_fprop.h"\n'

# cutlass_library's GroupMode member of each Conv2dKernel.group_mode
_GROUP_MODES = {"none": "NoneGroup", "single": "SingleGroup", "multiple": "MultipleGroup"}


def _conv2d_operation(kernel: Conv2dKernel):
    """The cutlass_library Conv2dOperation (fprop, NHWC) for `kernel`."""
    load_cutlass_library()
    from cutlass_library.conv2d_operation import Conv2dOperation
    from cutlass_library.library import (
        ConvKind,
        GroupMode,
        IteratorAlgorithm,
        LayoutType,
        StrideSupport,
        TensorDescription,
    )  # fmt: skip

    p = kernel.problem
    tile, functor, swizzle = sm80_description(kernel, p.element, p.element)
    tensor = TensorDescription(data_type(p.element), LayoutType.TensorNHWC, p.alignment)
    iterator = {"optimized": IteratorAlgorithm.Optimized, "analytic": IteratorAlgorithm.Analytic}[kernel.iterator]
    return Conv2dOperation(
        ConvKind.Fprop, iterator, 80, tile, tensor, tensor, tensor, data_type("float32"),
        StrideSupport.Unity,  # fprop iterators support any stride; the flag only matters for dgrad
        functor, swizzle, group_mode=getattr(GroupMode, _GROUP_MODES[kernel.group_mode]),
    )  # fmt: skip


# As for GEMM residual blocks, with the conv2d kernel cutlass_library would describe.
CONV2D_RESIDUAL_INSTANCE = Template("""\
using ${name}_base = typename cutlass::conv::kernel::DefaultConv2dFpropWithBroadcast<
    ${element}, cutlass::layout::TensorNHWC, ${element}, cutlass::layout::TensorNHWC,
    ${element}, cutlass::layout::TensorNHWC, ${element_acc},
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<${tb_m}, ${tb_n}, ${tb_k}>,
    cutlass::gemm::GemmShape<${w_m}, ${w_n}, ${w_k}>,
    cutlass::gemm::GemmShape<${i_m}, ${i_n}, ${i_k}>,
    cutlass::epilogue::thread::LinearCombinationResidualBlock<
        ${element}, ${element_acc}, float, ${element}, ${vector},
        ${activation}, ${residual_op}, ${post_activation}>,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<${swizzle}>,
    ${stages}, cutlass::arch::OpMultiplyAdd, ${iterator}, cutlass::conv::StrideSupport::kUnity,
    ${alignment}, ${alignment}>::Kernel;
""")


def _conv2d_kernel_parts(kernel: Conv2dKernel) -> dict[str, str]:
    load_cutlass_library()
    from cutlass_library.conv2d_operation import EmitConv2dInstance
    from cutlass_library.library import DataTypeTag, IteratorAlgorithmTag

    op = _conv2d_operation(kernel)
    epi = kernel.epilogue
    if epi.residual:
        base = CONV2D_RESIDUAL_INSTANCE.substitute(
            element=DataTypeTag[op.C.element],
            element_acc=DataTypeTag[op.accumulator_type()],
            iterator=IteratorAlgorithmTag[op.iterator_algorithm],
            **residual_block_values(kernel, op.C.element),
        )
        base_name, arguments = f"{kernel.name}_base", CONV2D_RESIDUAL_ARGUMENTS
    else:
        base = activation_prefix(kernel) + EmitConv2dInstance().emit(op)
        base_name, arguments = f"{op.procedural_name()}_base", CONV2D_ARGUMENTS
    # A TU-local kernel type, for the reason given at RESIDUAL_INSTANCE.
    local = f"struct {kernel.name}_kernel : {base_name} {{}};\n"
    return {
        "includes": CONV2D_INCLUDES + (GROUP_FPROP_INCLUDE if kernel.group_mode != "none" else ""),
        "instance": base + local,
        "operation_type": f"cutlass::conv::device::ImplicitGemmConvolution<{kernel.name}_kernel>",
        "arguments": arguments,
    }


def conv2d_glue_function(region: Conv2dRegion) -> str:
    p = region.kernel.problem
    roles = region.roles
    return CONV2D_GLUE_FUNCTION.substitute(
        checks=role_aliases(region) + tensor_checks(region, ("data", "weight", "out", "residual")),
        residual_ptr="Data(residual)" if "residual" in roles else "nullptr",
        groups=p.groups,
        **conv_glue_values(region, k=p.k, weight_i=p.channels_per_group, extra_checks=residual_checks(roles)),
    )


def emit_conv2d_kernel(kernel: Conv2dKernel) -> Source:
    parts = _conv2d_kernel_parts(kernel) if kernel.arch == 80 else conv2d_3x_kernel_parts(kernel)
    return device_kernel_source(kernel, parts, CONV2D_ARGS, ARGS_TYPE)
