"""Targets and kernel families per arch, and the SASS guard's logic (no nvcc here;
tests/test_nvcc.py builds real kernels and checks their SASS)."""

import subprocess
import types
from pathlib import Path

import pytest

import relax_cutlass
import relax_cutlass.arch
from relax_cutlass.arch import nvcc_gencode, parse_arch
from relax_cutlass.kinds.attention.records import AttentionProblem
from relax_cutlass.kinds.attention.select import choose_attention_kernel
from relax_cutlass.kinds.conv2d.records import Conv2dProblem
from relax_cutlass.kinds.conv2d.select import choose_conv2d_kernel
from relax_cutlass.kinds.epilogue import Epilogue
from relax_cutlass.kinds.gemm.records import GemmProblem
from relax_cutlass.kinds.gemm.select import choose_kernel
from relax_cutlass.stages.emit import emit_kernel
from relax_cutlass.testing.models import dense_epilogue_model
from relax_cutlass.toolkit import sass_check

SPELLINGS = {
    "sm_80": 80,
    "sm_86": 86,
    "SM_89": 89,
    "sm_90": 90,
    "sm_90a": 90,
    "90": 90,
    "sm_100": 100,
    "sm_100a": 100,
    "sm_100f": 100,
    "sm100a": 100,
    "100": 100,
    100: 100,
    "10.0": 100,
    "sm_103a": 103,
    "sm_103": 103,
    "sm_110": 110,
    "sm_120": 120,
    "sm_120a": 120,
    "sm_120f": 120,
    "12.0": 120,
    "sm_121": 121,
    "sm_121a": 121,
}
GEMM = GemmProblem(1024, 4096, 1024, True)


@pytest.mark.parametrize("spelling,sm", SPELLINGS.items())
def test_arch_spellings_and_the_family_each_gets(spelling, sm):
    assert parse_arch(spelling) == sm
    kernel = choose_kernel(GEMM, Epilogue(bias=True, activation="gelu"), parse_arch(spelling))
    assert kernel.target == sm
    if sm == 90:
        assert kernel.arch == 90 and kernel.name.startswith("sm90_") and kernel.note == ""
    elif sm in (100, 103, 110):
        # tcgen05 SMs get CUTLASS 3.x SM100 kernels, marked as not yet run on hardware
        assert kernel.arch == 100 and kernel.name.startswith("sm100_")
        assert "not yet run on Blackwell hardware" in kernel.note
    else:
        # everything else runs the CUTLASS 2.x mma.sync kernels; GeForce Blackwell is told why
        assert kernel.arch == 80 and kernel.name.startswith("sm80_")
        assert ("Blackwell" in kernel.note) == (sm >= 100)


@pytest.mark.parametrize("bad", ["sm_75", "sm_70", "sm_101", "sm_95", "hopper", "sm_100b", ""])
def test_unknown_arches_are_refused(bad):
    with pytest.raises(ValueError, match="arch"):
        parse_arch(bad)


@pytest.mark.parametrize(
    "cap,sm", [("8.0", 80), ("8.6", 86), ("9.0", 90), ("10.0", 100), ("10.3", 103), ("12.0", 120), ("12.1", 121)]
)
def test_auto_maps_nvidia_smi_compute_capabilities(monkeypatch, cap, sm):
    monkeypatch.setattr(relax_cutlass.arch.shutil, "which", lambda _: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(
        relax_cutlass.arch.subprocess,
        "run",
        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=f"{cap}\n{cap}\n", stderr=""),
    )
    assert parse_arch("auto") == sm


@pytest.mark.parametrize("sm", [100, 103, 110, 120, 121])
def test_blackwell_conv_and_attention_kernels(sm):
    """Convs: SM100 tcgen05 kernels where the SM has them (marked not yet run on hardware), SM80
    ones on GeForce Blackwell; attention: the SM80 kernel everywhere."""
    conv = Conv2dProblem(n=8, h=28, w=28, c=128, k=128, r=3, s=3, p=28, q=28, pad=(1, 1))
    kernel, _ = choose_conv2d_kernel(conv, Epilogue(bias=True, activation="relu"), sm)
    assert kernel.arch == (100 if sm in (100, 103, 110) else 80) and kernel.target == sm
    assert "Blackwell" in kernel.note
    attention = AttentionProblem(batch=8, heads=16, seq_q=128, seq_kv=128, head_dim=64, head_dim_value=64, scale=0.125)
    fmha = choose_attention_kernel(attention, sm)
    assert fmha.arch == 80 and fmha.target == sm and "Blackwell" in fmha.note


def test_family_option_per_arch():
    for arch in ("sm_100a", "sm_120", "sm_80", "sm_121"):
        with pytest.raises(ValueError, match="family='sm90' needs arch='sm_90a'"):
            relax_cutlass.offload_pipeline(arch, family="sm90")
        with pytest.raises(ValueError, match="family='sm90' needs"):
            choose_kernel(GEMM, Epilogue(), parse_arch(arch), family="sm90")
    for arch in ("sm_90a", "sm_120", "sm_80", "sm_121"):
        with pytest.raises(ValueError, match="family='sm100' needs arch='sm_100a'"):
            choose_kernel(GEMM, Epilogue(), parse_arch(arch), family="sm100")
    with pytest.raises(ValueError, match="family='sm70'"):
        relax_cutlass.offload_pipeline("sm_90a", family="sm70")
    for sm in (100, 103, 110):
        assert choose_kernel(GEMM, Epilogue(), sm, family="sm100") == choose_kernel(GEMM, Epilogue(), sm)
    # sm90 on sm_90a is what auto picks; sm80 keeps forcing the 2.x kernels, on Blackwell too
    assert choose_kernel(GEMM, Epilogue(), 90, family="sm90") == choose_kernel(GEMM, Epilogue(), 90)
    assert choose_kernel(GEMM, Epilogue(), 90, family="sm80").arch == 80
    assert choose_kernel(GEMM, Epilogue(), 100, family="sm80").arch == 80
    mod = dense_epilogue_model(512, 256, 128)
    (row,) = relax_cutlass.offload_report(mod, "sm_90a", family="sm90").offloaded
    assert row["family"] == "sm90" and row["target"] == "sm_90a"


def test_report_names_target_family_and_why():
    report = relax_cutlass.offload_report(dense_epilogue_model(512, 256, 128), "sm_100a")
    (row,) = report.offloaded
    assert row["family"] == "sm100" and row["target"] == "sm_100a" and row["kernel"].startswith("sm100_")
    assert "compile-verified, not yet run on Blackwell hardware" in row["note"]
    assert str(report).startswith("relax_cutlass offload report for sm_100a:")
    report = relax_cutlass.offload_report(dense_epilogue_model(512, 256, 128), "sm_120")
    (row,) = report.offloaded
    assert row["family"] == "sm80" and row["target"] == "sm_120" and row["kernel"].startswith("sm80_")
    assert "SM90 wgmma kernels do not run on Blackwell" in row["note"]
    assert str(report).startswith("relax_cutlass offload report for sm_120:")


def test_blackwell_tiles_fit_its_shared_memory():
    """sm_120 / sm_121 have 99 KB per CTA (the A100's 163 KB tiles would not launch); sm_100 227 KB."""
    from relax_cutlass.arch import smem_limit
    from relax_cutlass.kinds.gemm.select import tile_smem_bytes

    for sm, limit in ((120, 99), (121, 99), (100, 227), (103, 227)):
        assert smem_limit(sm) == limit * 1024
        assert tile_smem_bytes(choose_kernel(GEMM, Epilogue(), sm, family="sm80").tile) <= limit * 1024


def test_gencode_per_target():
    assert nvcc_gencode(90) == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert nvcc_gencode(80) == ["-gencode=arch=compute_80,code=[sm_80,compute_80]"]
    # tcgen05 targets build arch-specific objects (their SM100 kernels need sm_100a / sm_103a / sm_110a)
    assert nvcc_gencode(100) == ["-gencode=arch=compute_100a,code=sm_100a"]
    assert nvcc_gencode(103) == ["-gencode=arch=compute_103a,code=sm_103a"]
    assert nvcc_gencode(110) == ["-gencode=arch=compute_110a,code=sm_110a"]
    # GeForce Blackwell's SM80-family objects use no arch-specific feature: plain SASS (sm_120's also
    # runs on sm_121) plus PTX for newer GPUs
    assert nvcc_gencode(120) == ["-gencode=arch=compute_120,code=[sm_120,compute_120]"]


def test_run_time_device_check_per_target():
    text = emit_kernel(choose_kernel(GEMM, Epilogue(), 120)).text
    assert "cc >= 120" in text and "built for sm_120," in text  # sm_120 SASS + PTX: sm_120 and newer
    text = emit_kernel(choose_kernel(GEMM, Epilogue(), 100)).text
    assert "cc == 100" in text and "built for sm_100a" in text
    text = emit_kernel(choose_kernel(GEMM, Epilogue(), 90)).text
    assert "cc == 90" in text and "built for sm_90a" in text  # arch-specific: that SM only


def test_sources_carry_their_family():
    assert emit_kernel(choose_kernel(GEMM, Epilogue(), 90)).family == "sm90"
    assert emit_kernel(choose_kernel(GEMM, Epilogue(), 120)).family == "sm80"
    assert emit_kernel(choose_kernel(GEMM, Epilogue(), 100)).family == "sm100"
    attention = AttentionProblem(batch=1, heads=2, seq_q=64, seq_kv=64, head_dim=64, head_dim_value=64, scale=0.125)
    assert emit_kernel(choose_attention_kernel(attention, 100)).family == "fmha"


SASS = """
    code for sm_100
        Function : _Z6kernelv
    .headerflags	@"EF_CUDA_SM100 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM100)"
        /*0000*/                   LDC R1, c[0x0][0x37c] ;      /* 0x0000df00ff017b82 */
                                                                /* 0x000e220000000800 */
        /*0150*/                   HMMA.16816.F32 R24, R4, R16, R24 ;  /* 0x000000100418723c */
        /*0160*/               @P0 HMMA.16816.F32 R28, R4, R18, R28 ;  /* 0x000000120418723c */
        /*0170*/                   HGMMA.64x128x16.F32 R24, gdesc[UR4], R24 ;
        /*0180*/                   EXIT ;                       /* 0x000000000000794d */
"""


@pytest.fixture
def fake_cuobjdump(monkeypatch, tmp_path):
    """cuobjdump stand-in printing `SASS`, counting its runs."""
    runs = []

    def run(command, **_):
        runs.append(command)
        return subprocess.CompletedProcess(command, 0, stdout="arch = sm_100\n" + SASS, stderr="")

    monkeypatch.setattr(sass_check, "cuobjdump", lambda: "cuobjdump")
    monkeypatch.setattr(sass_check, "_disassembler_env", lambda: {})
    monkeypatch.setattr(sass_check.subprocess, "run", run)
    monkeypatch.delenv(sass_check.CHECK_ENV, raising=False)
    obj = tmp_path / "k.o"
    obj.write_bytes(b"object")
    return types.SimpleNamespace(runs=runs, obj=obj)


def test_sass_counts_mma_opcodes(fake_cuobjdump):
    counts, arches, _ = sass_check.mma_counts(fake_cuobjdump.obj, ("HMMA", "HGMMA", "UTCHMMA"))
    assert counts == {"HMMA": 2, "HGMMA": 1, "UTCHMMA": 0} and arches == ["sm_100"]


def test_guard_checks_once_and_remembers(fake_cuobjdump):
    record = sass_check.verify_object(fake_cuobjdump.obj, "k", "sm80", 100)
    assert record["ok"] and record["counts"] == {"HMMA": 2}
    assert sass_check.verify_object(fake_cuobjdump.obj, "k", "sm80", 100)["ok"]
    assert len(fake_cuobjdump.runs) == 1  # the cached object's record is reused
    assert Path(str(fake_cuobjdump.obj) + ".sass.json").exists()
    fake_cuobjdump.obj.write_bytes(b"a rebuilt object")  # a changed object is checked again
    sass_check.verify_object(fake_cuobjdump.obj, "k", "sm80", 100)
    assert len(fake_cuobjdump.runs) == 2
    assert sass_check.verify_object(fake_cuobjdump.obj, "k", "", 100) is None  # not a tensor-core kernel


def test_guard_rejects_a_kernel_without_its_family_instructions(fake_cuobjdump, monkeypatch):
    monkeypatch.setitem(sass_check.FAMILIES, "sm100", ("CUTLASS 3.x SM100 tcgen05", ("UTCHMMA",)))
    for _ in range(2):  # the recorded failure fails again, without another disassembly
        with pytest.raises(sass_check.StubKernelError, match="stub kernel: k .* must contain UTCHMMA") as err:
            sass_check.verify_object(fake_cuobjdump.obj, "k", "sm100", 100)
    assert isinstance(err.value, relax_cutlass.toolkit.compile.CompileError) and err.value.counts == {"UTCHMMA": 0}
    assert len(fake_cuobjdump.runs) == 1
    monkeypatch.setenv(sass_check.CHECK_ENV, "0")  # the documented opt-out
    assert sass_check.verify_object(fake_cuobjdump.obj, "k", "sm100", 100) is None


def test_missing_cuobjdump_fails_closed_naming_what_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv(sass_check.CUOBJDUMP_ENV, raising=False)
    monkeypatch.setattr(sass_check, "_wheel_binaries", lambda *_: [])
    monkeypatch.setattr(sass_check.shutil, "which", lambda _: None)
    monkeypatch.setattr(
        relax_cutlass.toolkit.compile,
        "toolchain",
        lambda: types.SimpleNamespace(nvcc=str(tmp_path / "nvcc"), cuda_home=tmp_path),
    )
    sass_check.cuobjdump.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="pip install nvidia-cuda-cuobjdump.*RELAX_CUTLASS_SASS_CHECK=0"):
            sass_check.cuobjdump()
    finally:
        sass_check.cuobjdump.cache_clear()
