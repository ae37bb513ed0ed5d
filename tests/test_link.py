"""Modules link with any toolchain: the merged object needs nothing from the C++ runtime.

On some hosts `$CXX`'s libstdc++ exists only as a static, non-PIC archive, which no shared library
can contain; TVM links exported libraries (and, for the VM, unlinked external objects) with `$CXX`.
The glue is written against tvm-ffi's C ABI, so its checks are tested here through that ABI too:
compiled with the host compiler and linked with stand-ins for the kernels and the CUDA runtime.
"""

import ctypes
import dataclasses
import re
import shutil
import subprocess
from pathlib import Path
from string import Template

import numpy as np
import pytest
import tvm_ffi

import relax_cutlass
from relax_cutlass.prepare import bind_weights
from relax_cutlass.stages.codegen import CodegenOptions, plan_regions
from relax_cutlass.stages.constants import offloaded_functions
from relax_cutlass.stages.emit import emit_glue, emit_kernel
from relax_cutlass.testing.attention import torch_export_attention
from relax_cutlass.testing.models import conv2d_epilogue_model, dense_epilogue_model, random_weights
from relax_cutlass.toolkit.compile import compile_all, link_relocatable, toolchain
from relax_cutlass.transform import LiftConstants, PartitionForCutlass


def regions_of(mod, arch="sm_80"):
    mod = LiftConstants()(PartitionForCutlass()(mod))
    return plan_regions([f for _, f in offloaded_functions(mod)], CodegenOptions.create(arch))


# --- the glue through tvm-ffi's C ABI, with stand-in kernels and CUDA runtime (host compiler only) ---

# Each kernel records its call; the CUDA runtime's error state is what the test sets.
STAND_INS = """\
#include <stdint.h>
const char* kernel_error = 0;         /* what every kernel returns */
const char* last_kernel = 0;          /* the last kernel called, and the first int64 of its args */
int64_t last_first_arg = -1;
int pending_error = 0;                /* what cudaGetLastError returns (then 0) */
$kernels
int cudaGetLastError(void) { int e = pending_error; pending_error = 0; return e; }
const char* cudaGetErrorName(int e) {
  return e == 700 ? "cudaErrorIllegalAddress" : e == 35 ? "cudaErrorInsufficientDriver" : "cudaErrorOther";
}
const char* cudaGetErrorString(int e) { return e == 700 ? "an illegal memory access was encountered" : "?"; }
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
        self.set("pending_error", ctypes.c_int, 0)


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
    # M = 0: nothing runs, and CUDA is not even asked.
    state.reset()
    state.set("pending_error", ctypes.c_int, 700)
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

    # An error left by earlier CUDA work is raised, naming it, and nothing is launched.
    state.reset()
    state.set("pending_error", ctypes.c_int, 700)
    with pytest.raises(RuntimeError, match=f"^{gemm.symbol}: not launched: an error from earlier CUDA work is "
                       r"pending \(cudaErrorIllegalAddress: an illegal memory access was encountered\)"):  # fmt: skip
        fn(cuda(np.zeros((8, 32), "float16")), w, b, cuda(np.zeros((8, 64), "float16")))
    assert state.get("last_kernel", ctypes.c_char_p) is None
    state.set("pending_error", ctypes.c_int, 35)
    with pytest.raises(RuntimeError, match=f"^{gemm.symbol}: no usable CUDA device \\(cudaErrorInsufficientDriver"):
        fn(cuda(np.zeros((8, 32), "float16")), w, b, cuda(np.zeros((8, 64), "float16")))
    # A kernel's own error is a RuntimeError naming the region, the kernel and the operands' shapes.
    state.reset()
    state.set("kernel_error", ctypes.c_char_p, b"some_kernel: run failed: Error Internal")
    with pytest.raises(
        RuntimeError,
        match=f"^{gemm.symbol}: some_kernel: run failed: Error Internal "
        "\\(operands: lhs \\(8, 32\\), .*out \\(8, 64\\)\\)$",
    ):
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


# --- real builds (nvcc) ---


def _archive(name: str) -> Path | None:
    found = subprocess.run([toolchain().cxx, f"-print-file-name={name}"], capture_output=True, text=True).stdout
    path = Path(found.strip())
    return path if path.is_absolute() and path.exists() else None


def _defined(archive: Path) -> dict[str, str]:
    """{symbol: nm type letter} of every global symbol `archive` defines."""
    listing = subprocess.run(["nm", "-g", "--defined-only", str(archive)], capture_output=True, text=True).stdout
    return {f[2]: f[1] for f in map(str.split, listing.splitlines()) if len(f) == 3}


def _dense_module():
    """The module every test here builds: one small dense + bias + gelu region (one kernel)."""
    mod = dense_epilogue_model(128, 256, 128, activation="gelu")
    return bind_weights(mod, random_weights(mod))


@pytest.mark.nvcc
def test_merged_object_needs_nothing_from_the_cxx_runtime():
    archives = [a for a in map(_archive, ("libstdc++.a", "libsupc++.a", "libgcc_eh.a")) if a]
    if not archives:
        pytest.skip(f"{toolchain().cxx} has no static C++ runtime archives to compare with")
    runtime = {name for a in archives for name in _defined(a)}
    (region,) = regions_of(_dense_module())
    sources = [emit_kernel(region.kernel), emit_glue([region], "link_test")]
    objects = compile_all(sources, 80)
    merged = link_relocatable([objects[s.name][0] for s in sources], "link_test")
    undefined = set(
        subprocess.run(["nm", "-u", str(merged)], capture_output=True, text=True, check=True).stdout.split()
    )
    assert "cudaGetLastError" not in undefined  # the static CUDA runtime is inside
    assert not sorted(undefined & runtime)


def _static_only_cxx(root: Path) -> Path:
    """A `g++` whose libstdc++ is only a static, non-PIC archive: it defines every symbol the real
    libstdc++.a / libsupc++.a define (weak ones weak) in one object holding an absolute (R_X86_64_32)
    relocation, so any reference to any of them makes a shared link fail."""
    gxx, gcc = shutil.which("g++"), shutil.which("gcc")
    archives = [a for a in map(_archive, ("libstdc++.a", "libsupc++.a")) if a]
    if not (gxx and gcc and archives):
        pytest.skip("needs g++, gcc and the static libstdc++ to imitate")
    symbols = {}
    for archive in archives:
        symbols.update(_defined(archive))
    lines = [".data", "relax_cutlass_fake_data: .long 0", ".text"]
    for name, kind in sorted(symbols.items()):
        lines += [f'.{"weak" if kind in "WVu" else "globl"} "{name}"', f'"{name}":']
    lines += ["  movl $relax_cutlass_fake_data, %eax", "  ret", '.section .note.GNU-stack,"",@progbits']
    (root / "fake.s").write_text("\n".join(lines) + "\n")
    subprocess.run([gcc, "-c", "-fno-pic", "-mcmodel=small", "fake.s", "-o", "fake.o"], cwd=root, check=True)
    subprocess.run(["ar", "rcs", "libstdc++.a", "fake.o"], cwd=root, check=True)
    wrapper = root / "g++"
    # Compiling is the real g++'s; linking is the C driver's (no libstdc++ of its own) plus ours.
    wrapper.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do case "$a" in -c|-E|-S|-print-*) exec {gxx} "$@";; esac; done\n'
        f'exec {gcc} "$@" -L{root} -lstdc++ -lm\n'
    )
    wrapper.chmod(0o755)
    probe = subprocess.run([str(wrapper), "-shared", "-fPIC", "-o", str(root / "probe.so"), "fake.o"], cwd=root,
                           capture_output=True, text=True)  # fmt: skip
    assert probe.returncode != 0 and "recompile with -fPIC" in probe.stderr, probe.stderr  # it is unusable
    return wrapper


@pytest.mark.nvcc
def test_exports_with_a_static_non_pic_libstdcxx(tmp_path, monkeypatch):
    """export_library links the module with $CXX (and so does the VM, through Executable.jit, for a
    module not linked yet): with a libstdc++ that cannot go into a shared library, both must still
    succeed, and the library must load and check its arguments."""
    import tvm

    toolchain()  # cached with the real compiler: the wrapper lives only as long as this test
    fake = tmp_path / "toolchain"
    fake.mkdir()
    monkeypatch.setenv("CXX", str(_static_only_cxx(fake)))
    offloaded = relax_cutlass.offload_pipeline("sm_80")(_dense_module())
    (row,) = relax_cutlass.offload_report(offloaded).offloaded
    ex = tvm.compile(offloaded, tvm.target.Target({"kind": "cuda", "arch": "sm_80"}, host="llvm"))
    lib = tmp_path / "model.so"
    ex.export_library(str(lib))
    for module in (tvm.runtime.load_module(str(lib)), ex.jit()):
        fn = module.get_function(row["symbol"], query_imports=True)
        with pytest.raises(ValueError, match="lhs must be on a CUDA device"):
            fn(*(tvm.runtime.tensor(np.zeros(s, "float16")) for s in ([128, 128], [128, 256], [256], [128, 256])))
