"""C++ of epilogue activations: custom activation functors (relax_cutlass.extend), the 16-bit GELU,
and the program that checks a functor against its reference."""

from __future__ import annotations

from string import Template

# An elementwise functor applied to a whole fragment, as the Array-typed epilogues call it; appended
# to the scalar definitions below (a Template over `functor`).
_ARRAY_SPECIALIZATION = """\
template <typename T, int N>
struct $functor<cutlass::Array<T, N>> {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& value) const {
    $functor<T> scalar;
    cutlass::Array<T, N> result;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) result[i] = scalar(value[i]);
    return result;
  }
};
"""


# A custom activation (relax_cutlass.extend) as the functor CUTLASS's epilogues instantiate: over
# the compute element (float) for the 2.x traits, and over Array<float, N> for the 2.x generic and
# residual-block epilogues and the SM90 EVT compute node.
ACTIVATION_FUNCTOR = Template(
    """\
// custom activation $name: $expression
template <typename T>
struct $functor {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE T operator()(T const& value) const {
    float const x = static_cast<float>(value);
    return static_cast<T>($expression);
  }
};
"""
    + _ARRAY_SPECIALIZATION
)


# GELU (erf form) for kernels that write 16-bit outputs: CUTLASS's GELU calls erff, about 20
# instructions per element, which costs an H100 SM90 kernel up to 36%. Here
#     gelu(x) = x * Phi(x) = relu(x) - |x| * Q(|x|),  Q(t) = 1 - Phi(t) = 2^P(t),
# with P a degree-5 polynomial fitted to log2(1 - Phi(t)) (relax_cutlass/testing/gelu16.py): 5 FMAs, one
# ex2.approx, a max and an FMA, like CUTLASS's tanh GELU. Q is accurate *relatively*, so the negative
# tail keeps its precision too: within 1 fp16 ulp of the correctly rounded value for every finite
# fp16 input (tests/test_gelu16.py); x = +inf gives NaN. Not used for float32 outputs.
GELU16_FUNCTOR = Template(
    """\
// gelu(x) = relu(x) - |x| * 2^P(|x|), P ~ log2(1 - Phi): 16-bit outputs only (see templates.py)
template <typename T>
struct $functor {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE T operator()(T const& value) const {
    float const x = static_cast<float>(value);
    float const t = fabsf(x);
    float p = ${c5};
    p = fmaf(p, t, ${c4});
    p = fmaf(p, t, ${c3});
    p = fmaf(p, t, ${c2});
    p = fmaf(p, t, ${c1});
    p = fmaf(p, t, ${c0});
    float tail;
#if defined(__CUDA_ARCH__)
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(tail) : "f"(p));
#else
    tail = exp2f(p);
#endif
    return static_cast<T>(fmaf(-t, tail, fmaxf(x, 0.0f)));
  }
};
"""
    + _ARRAY_SPECIALIZATION
)


# Sigmoid-based activations for kernels that write 16-bit outputs. CUTLASS's Sigmoid / SiLu call
# expf and an IEEE division and its GELU_taylor calls tanhf, each 10-20 instructions per element;
# in an SM90 epilogue that is what made Llama's silu(gate) * up GEMM 1.5x slower than the same GEMM
# without it. Here, with z the sigmoid's argument,
#     sigmoid(z) = rcp.approx(1 + ex2.approx(-z * log2(e)))
# (two MUFU instructions, each within 2^-22 relative), and
#     silu(x) = x * sigmoid(x),   gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x * sigmoid(2u),
# with u = sqrt(2/pi) (x + 0.044715 x^3): no cancellation in the negative tails, so the result is
# within 1 ulp of the correctly rounded value for every finite fp16 input (tests/test_sigmoid16.py).
# Results below 2^-126 in magnitude flush to zero (ftz). Not used for float32 outputs.
SIGMOID16_FUNCTOR = Template(
    """\
// $name for 16-bit outputs: sigmoid(z) = rcp.approx(1 + ex2.approx(-z log2 e)) (see templates.py)
template <typename T>
struct $functor {
  static const bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE T operator()(T const& value) const {
    float const x = static_cast<float>(value);
    float const z = $argument;
    float e, s;
#if defined(__CUDA_ARCH__)
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(z * -1.44269504f));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(1.0f + e));
#else
    e = exp2f(z * -1.44269504f);
    s = 1.0f / (1.0f + e);
#endif
    return static_cast<T>($result);
  }
};
"""
    + _ARRAY_SPECIALIZATION
)


# check_activation's program: the functor evaluated on the host, elementwise and through the Array
# form the kernels use; the device side is compiled (for the target arch) but never launched.
ACTIVATION_CHECK_PROGRAM = Template("""\
#include <cmath>
#include <cstdio>
#include "cutlass/cutlass.h"
#include "cutlass/array.h"

namespace {
$definition
__global__ void device_compile_check(float* values) {
  $functor<cutlass::Array<float, 8>> op;
  cutlass::Array<float, 8> v;
  for (int i = 0; i < 8; ++i) v[i] = values[i];
  v = op(v);
  for (int i = 0; i < 8; ++i) values[i] = v[i];
}
}  // namespace

int main() {
  static const float inputs[] = {$inputs};
  constexpr int kCount = sizeof(inputs) / sizeof(inputs[0]);
  $functor<float> scalar;
  $functor<cutlass::Array<float, 1>> vector;
  for (int i = 0; i < kCount; ++i) {
    cutlass::Array<float, 1> v;
    v[0] = inputs[i];
    std::printf("%.9g %.9g\\n", scalar(inputs[i]), vector(v)[0]);
  }
  return 0;
}
""")
