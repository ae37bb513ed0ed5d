"""The glue, written against tvm-ffi's C ABI (so that modules need nothing from the C++ runtime),
is tested through that ABI:
compiled with the host compiler and linked with stand-ins for the kernels.
"""

import ctypes
import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from string import Template

import numpy as np
import pytest
import tvm_ffi

from relax_cutlass.codegen import CodegenOptions, plan_regions
from relax_cutlass.compile import compile_all
from relax_cutlass.constants import offloaded_functions
from relax_cutlass.emit import emit_glue
from relax_cutlass.models import bind_weights, conv2d_epilogue_model, dense_epilogue_model, random_weights
from relax_cutlass.transform import LiftConstants, PartitionForCutlass

sys.path.insert(0, str(Path(__file__).parent))
from test_attention import torch_export_attention  # noqa: E402


def regions_of(mod, arch="sm_80"):
    mod = LiftConstants()(PartitionForCutlass()(mod))
    return plan_regions([f for _, f in offloaded_functions(mod)], CodegenOptions.create(arch))


# --- the glue through tvm-ffi's C ABI, with stand-in kernels and CUDA runtime (host compiler only) ---

# Each kernel records its call and returns what the test sets.
STAND_INS = """\
#include <stdint.h>
const char* kernel_error = 0;         /* what every kernel returns */
const char* last_kernel = 0;          /* the last kernel called, and the first int64 of its args */
int64_t last_first_arg = -1;
$kernels
"""

STAND_IN_KERNEL = """\
const char* ${name}_run(const int64_t* args, void* stream) {
  last_kernel = "$name";
  last_first_arg = args[0];
  return kernel_error;
}
"""


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
    ]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


class _OnCuda:
    """A numpy array presented through DLPack as if it lived on cuda:<device_id> (the glue reads
    shapes, dtypes and addresses, never the data; the stand-in kernels do not either)."""

    def __init__(self, array, device_id=0):
        self.array, self.device_id = array, device_id

    def __dlpack_device__(self):
        return (2, self.device_id)

    def __dlpack__(self, *args, **kwargs):
        capsule = self.array.__dlpack__()
        _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor")).device = _DLDevice(2, self.device_id)
        return capsule


def cuda(array, device_id=0):
    return tvm_ffi.from_dlpack(_OnCuda(array, device_id))


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    """(library, {role: region}): the glue of a symbolic-M dense region dispatching on M between two
    kernels, a conv2d region and an attention region, as a shared library with the stand-ins."""
    dense = dense_epilogue_model("m", 64, 32, activation="relu")
    (gemm,) = regions_of(bind_weights(dense, random_weights(dense)))
    small = dataclasses.replace(gemm.kernel, tile=dataclasses.replace(gemm.kernel.tile, stages=3))
    gemm = dataclasses.replace(gemm, dispatch=((64, small), (16384, gemm.kernel)))
    conv = conv2d_epilogue_model(2, 8, 8, 16, 16, kernel=3, padding=1, layout="NHWC")
    (conv,) = regions_of(bind_weights(conv, random_weights(conv)))
    (attention,) = regions_of(torch_export_attention(b=2, s=16, n=4, h=64, symbolic_batch=True))
    regions = {"gemm": gemm, "conv": conv, "attention": attention}
    ((glue_obj, _),) = compile_all([emit_glue(list(regions.values()), "abi_test")], 80).values()
    root = tmp_path_factory.mktemp("glue")
    kernels = sorted({k.name for r in regions.values() for k in r.kernels})
    stubs = Template(STAND_INS).substitute(
        kernels="".join(Template(STAND_IN_KERNEL).substitute(name=k) for k in kernels)
    )
    (root / "stand_ins.c").write_text(stubs)
    library = root / "glue.so"
    libdir = Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(library), str(glue_obj), str(root / "stand_ins.c"),
         f"-L{libdir}", "-ltvm_ffi", f"-Wl,-rpath,{libdir}"],
        check=True,
    )  # fmt: skip
    return library, regions


class _State:
    def __init__(self, library):
        self.lib = ctypes.CDLL(str(library))

    def set(self, name, ctype, value):
        ctype.in_dll(self.lib, name).value = value

    def get(self, name, ctype):
        return ctype.in_dll(self.lib, name).value

    def reset(self):
        self.set("kernel_error", ctypes.c_char_p, None)
        self.set("last_kernel", ctypes.c_char_p, None)
        self.set("last_first_arg", ctypes.c_int64, -1)


def test_glue_checks_and_launches_through_the_c_abi(glue):
    library, regions = glue
    module = tvm_ffi.load_module(str(library))
    state = _State(library)
    gemm = regions["gemm"]
    fn = module[gemm.symbol]
    small, big = (k.name for k in gemm.kernels)
    w, b = cuda(np.zeros((32, 64), "float16")), cuda(np.zeros(64, "float16"))  # rhs is (K, N)

    def call(m=8, k=32, lhs=None, out=None, extra=()):
        state.reset()
        lhs = lhs if lhs is not None else cuda(np.zeros((m, k), "float16"))
        out = out if out is not None else cuda(np.zeros((m, 64), "float16"))
        return fn(lhs, w, b, out, *extra)

    # Valid calls: the kernel of M's bucket runs with M.
    for m, kernel in ((8, small), (64, small), (100, big)):
        call(m)
        assert state.get("last_kernel", ctypes.c_char_p).decode() == kernel
        assert state.get("last_first_arg", ctypes.c_int64) == m
    # M = 0: nothing runs.
    state.reset()
    fn(cuda(np.zeros((0, 32), "float16")), w, b, cuda(np.zeros((0, 64), "float16")))
    assert state.get("last_kernel", ctypes.c_char_p) is None

    bad = {
        "lhs must be on a CUDA device (got device type 1)": (
            ValueError, dict(lhs=tvm_ffi.from_dlpack(np.zeros((8, 32), "float16")))),
        "lhs is on cuda:1 but the output is on cuda:0": (ValueError, dict(lhs=cuda(np.zeros((8, 32), "float16"), 1))),
        "lhs has the wrong dtype (code 2, 32 bits); the kernel was built for code 2, 16 bits": (
            TypeError, dict(lhs=cuda(np.zeros((8, 32), "float32")))),
        "lhs must be contiguous (row-major)": (ValueError, dict(lhs=cuda(np.zeros((8, 64), "float16")[:, ::2]))),
        "lhs data is not 16-byte aligned, which the kernel's vector width requires": (
            ValueError, dict(lhs=cuda(np.zeros(8 * 32 + 1, "float16")[1:].reshape(8, 32)))),
        "lhs inner dim K is 40 but the kernel was built for 32 (shape (8, 40))": (ValueError, dict(k=40)),
        "lhs must have rank >= 2, got (32)": (ValueError, dict(lhs=cuda(np.zeros(32, "float16")))),
        "output dim N is 60 but the kernel was built for 64 (shape (8, 60))": (
            ValueError, dict(out=cuda(np.zeros((8, 60), "float16")))),
        "takes 4 arguments (lhs, rhs, bias, out), got 5": (TypeError, dict(extra=(1,))),
    }  # fmt: skip
    for message, (kind, kwargs) in bad.items():
        with pytest.raises(kind, match=f"^{gemm.symbol}: " + re.escape(message)):
            call(**kwargs)
        assert state.get("last_kernel", ctypes.c_char_p) is None
    with pytest.raises(TypeError, match=r"argument #1 \(rhs\) must be a tensor, got int"):
        fn(cuda(np.zeros((8, 32), "float16")), 3, b, cuda(np.zeros((8, 64), "float16")))

    # A kernel's own error is a RuntimeError naming the region.
    state.reset()
    state.set("kernel_error", ctypes.c_char_p, b"some_kernel: run failed: Error Internal")
    with pytest.raises(RuntimeError, match=f"^{gemm.symbol}: some_kernel: run failed: Error Internal"):
        fn(cuda(np.zeros((8, 32), "float16")), w, b, cuda(np.zeros((8, 64), "float16")))


def test_conv2d_and_attention_glue_through_the_c_abi(glue):
    library, regions = glue
    module = tvm_ffi.load_module(str(library))
    state = _State(library)
    conv = regions["conv"]
    args = [cuda(np.zeros(shape, "float16")) for shape in conv.arg_shapes]
    state.reset()
    module[conv.symbol](*args, cuda(np.zeros((2, 8, 8, 16), "float16")))
    assert state.get("last_kernel", ctypes.c_char_p).decode() == conv.kernel.name
    assert state.get("last_first_arg", ctypes.c_int64) & 0xFFFFFFFF == 2  # args.n, an int
    data = conv.arg_roles.index("data")
    args[data] = cuda(np.zeros((2, 8, 8, 24), "float16"))
    with pytest.raises(ValueError, match=r"data C is 24 but the kernel was built for 16 \(shape \(2, 8, 8, 24\)\)"):
        module[conv.symbol](*args, cuda(np.zeros((2, 8, 8, 16), "float16")))

    attention = regions["attention"]
    fn = module[attention.symbol]
    out = cuda(np.zeros((2, 16, 4, 64), "float16"))

    def args(query):  # q, k, v as (B, S, N, H); the R.Shape parameters of symbolic views are ignored
        qkv = {"query": query, "key": cuda(np.zeros((2, 16, 4, 64), "float16"))}
        qkv["value"] = qkv["key"]
        return [tvm_ffi.Shape([1]) if dtype == "shape" else qkv[role]
                for role, dtype in zip(attention.arg_roles, attention.arg_dtypes, strict=True)] + [out]  # fmt: skip

    state.reset()
    fn(*args(cuda(np.zeros((2, 16, 4, 64), "float16"))))
    assert state.get("last_first_arg", ctypes.c_int64) == 2  # the batch
    with pytest.raises(ValueError, match=r"query rank is 3 but the kernel was built for 4 \(shape \(2, 16, 256\)\)"):
        fn(*args(cuda(np.zeros((2, 16, 256), "float16"))))
