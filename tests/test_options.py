"""Every option and RELAX_CUTLASS_* variable is checked where it enters (the pass constructor, or the
variable's first read at build time): a value relax_cutlass does not take is an error naming the
option or variable and the value, never a silent default. An offloaded module is never re-targeted
to another arch without a word."""

from __future__ import annotations

import os
import warnings

import pytest
import tvm
from tvm.script import relax as R

import relax_cutlass
from relax_cutlass.toolkit import compile as compile_stage
from relax_cutlass.toolkit.settings import SettingError
from relax_cutlass.toolkit.tuning import TuningDatabase, TuningDatabaseWarning


@tvm.script.ir_module
class Linear:
    @R.function
    def main(x: R.Tensor((16, 32), "float16"), w: R.Tensor((64, 32), "float16")):
        with R.dataflow():
            y = R.matmul(x, R.permute_dims(w))
            R.output(y)
        return y


def _a_file(tmp_path) -> str:
    path = tmp_path / "a_file"
    path.write_text("")
    return str(path)


# (options, environment, what the message must name)
OPTION_CASES = {
    "compile a string": ({"compile": "no"}, {}, "compile='no'"),
    "jobs negative": ({"jobs": -1}, {}, "jobs=-1"),
    "jobs zero": ({"jobs": 0}, {}, "jobs=0"),
    "jobs not a number": ({"jobs": "abc"}, {}, "jobs='abc'"),
    "jobs a bool": ({"jobs": True}, {}, "jobs=True"),
    "m_hint negative": ({"m_hint": -5}, {}, "m_hint=-5"),
    "m_hint not a number": ({"m_hint": "large"}, {}, "m_hint='large'"),
    "tile unknown": ({"tile": "abc"}, {}, "tile='abc' is no kernel configuration"),
    "tile not a string": ({"tile": 128}, {}, "tile=128"),
    "profile unknown": ({"profile": "sometimes"}, {}, "profile='sometimes'"),
    "tuning_db a directory": ({"tuning_db": "{tmp}"}, {}, "tuning_db='{tmp}' is a directory"),
    "RELAX_CUTLASS_JOBS not a number": ({}, {"RELAX_CUTLASS_JOBS": "abc"}, "RELAX_CUTLASS_JOBS='abc'"),
    "RELAX_CUTLASS_JOBS negative": ({}, {"RELAX_CUTLASS_JOBS": "-2"}, "RELAX_CUTLASS_JOBS='-2'"),
    "RELAX_CUTLASS_PDL off": ({}, {"RELAX_CUTLASS_PDL": "off"}, "RELAX_CUTLASS_PDL='off' is not a setting"),
    "RELAX_CUTLASS_PDL a typo": ({}, {"RELAX_CUTLASS_PDL": "always:gem"}, "RELAX_CUTLASS_PDL='always:gem'"),
    "RELAX_CUTLASS_PROFILE unknown": ({}, {"RELAX_CUTLASS_PROFILE": "yes"}, "RELAX_CUTLASS_PROFILE='yes'"),
    "RELAX_CUTLASS_TUNING_DB a directory": ({}, {"RELAX_CUTLASS_TUNING_DB": "{tmp}"}, "RELAX_CUTLASS_TUNING_DB="),
    "RELAX_CUTLASS_CACHE_DIR not creatable": (
        {},
        {"RELAX_CUTLASS_CACHE_DIR": "{file}/cache"},
        "RELAX_CUTLASS_CACHE_DIR='{file}/cache' cannot be created",
    ),
    "RELAX_CUTLASS_SASS_CHECK unknown": ({}, {"RELAX_CUTLASS_SASS_CHECK": "maybe"}, "RELAX_CUTLASS_SASS_CHECK='maybe'"),
    "RELAX_CUTLASS_COMPILE_LOG in a missing folder": (
        {},
        {"RELAX_CUTLASS_COMPILE_LOG": "{tmp}/missing/log.jsonl"},
        "RELAX_CUTLASS_COMPILE_LOG='{tmp}/missing/log.jsonl'",
    ),
    "RELAX_CUTLASS_COMPILE_LOG a folder": ({}, {"RELAX_CUTLASS_COMPILE_LOG": "{tmp}"}, "RELAX_CUTLASS_COMPILE_LOG="),
}


@pytest.mark.parametrize("case", sorted(OPTION_CASES))
def test_a_bad_option_or_variable_is_named_where_it_enters(case, monkeypatch, tmp_path):
    options, environment, named = OPTION_CASES[case]
    fill = {"tmp": str(tmp_path), "file": _a_file(tmp_path)}
    options = {k: v.format(**fill) if isinstance(v, str) else v for k, v in options.items()}
    for name, value in environment.items():
        monkeypatch.setenv(name, value.format(**fill))
    with pytest.raises(SettingError) as caught:
        relax_cutlass.offload_pipeline("sm_80", **options)  # the constructor, before any module
    assert named.format(**fill) in str(caught.value), caught.value


def test_good_values_pass_as_given(monkeypatch):
    monkeypatch.setenv("RELAX_CUTLASS_JOBS", "3")
    monkeypatch.setenv("RELAX_CUTLASS_PDL", "always:gemm+norm")
    options = relax_cutlass.transform.CutlassCodegen("sm_90a", compile=False, m_hint="64").options
    assert options.jobs == 3 and options.m_hint == 64
    assert relax_cutlass.transform.CutlassCodegen("sm_90a", compile=False, jobs=2).options.jobs == 2
    for tile in ("tb128x128x32_w2x2x1_s3_swz8", "tb128x128x64_c1x1x1_cooperative_streamk", "direct_p8q16g32t2x4"):
        relax_cutlass.offload_pipeline("sm_90a", compile=False, tile=tile)


def test_relax_cutlass_nvcc_that_is_no_executable(monkeypatch, tmp_path):
    monkeypatch.setenv("RELAX_CUTLASS_NVCC", str(tmp_path / "nvcc"))
    compile_stage.toolchain.cache_clear()
    try:
        with pytest.raises(SettingError, match="RELAX_CUTLASS_NVCC=.*is not an executable"):
            compile_stage.toolchain()
    finally:
        monkeypatch.delenv("RELAX_CUTLASS_NVCC")
        compile_stage.toolchain.cache_clear()


def test_a_pinned_tile_that_no_region_can_take_is_explained_not_a_bug():
    with pytest.warns(UserWarning) as caught:
        rewritten = relax_cutlass.offload_pipeline("sm_80", compile=False, tile="tb128x128x64_c1x1x1_cooperative")(
            Linear
        )
    (message,) = [str(w.message) for w in caught if "could not offload" in str(w.message)]
    assert "tile='tb128x128x64_c1x1x1_cooperative' is not an SM80 candidate" in message and "bug" not in message
    (left,) = relax_cutlass.offload_report(rewritten).left_in_tvm
    assert "is not an SM80 candidate" in left["reasons"][0]


def test_an_offloaded_module_is_not_retargeted():
    """offload_pipeline("sm_80") on a module offloaded for sm_90a once set its arch to 80 and kept
    the SM90 kernel call; the report still said sm_90a. Now it is refused, naming both."""
    offloaded = relax_cutlass.offload_pipeline("sm_90a", compile=False)(Linear)
    with pytest.raises(ValueError, match="already partitioned for sm_90a .* cannot offload it for sm_80"):
        relax_cutlass.offload_pipeline("sm_80", compile=False)(offloaded)
    with pytest.raises(ValueError, match="already partitioned for sm_90a .* cannot build its kernels for sm_80"):
        relax_cutlass.transform.CutlassCodegen("sm_80", compile=False)(
            relax_cutlass.pipeline.partition_as_offloaded(Linear, "sm_90a")
        )
    again = relax_cutlass.offload_pipeline("sm_90a", compile=False)(offloaded)  # the same arch: nothing new
    assert len(relax_cutlass.offload_report(again).offloaded) == 1


def test_the_report_of_an_offloaded_module_says_which_arch_it_holds():
    offloaded = relax_cutlass.offload_pipeline("sm_90a", compile=False)(Linear)
    assert "for sm_90a" in str(relax_cutlass.offload_report(offloaded))
    with pytest.warns(UserWarning, match="asked for sm_80, but this module's kernels were built for sm_90a"):
        report = relax_cutlass.offload_report(offloaded, arch="sm_80")
    assert report.notes and "[note]" in str(report) and report.offloaded[0]["target"] == "sm_90a"
    with pytest.raises(ValueError, match="already partitioned for sm_90a"):
        relax_cutlass.offload_report(relax_cutlass.pipeline.partition_as_offloaded(Linear, "sm_90a"), arch="sm_80")


def test_a_tuning_database_in_a_missing_directory_warns_once(tmp_path):
    path = str(tmp_path / "no_such_dir" / "db.jsonl")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            relax_cutlass.offload_pipeline("sm_80", compile=False, tuning_db=path)
    missing = [w for w in caught if issubclass(w.category, TuningDatabaseWarning)]
    assert len(missing) == 1 and "its directory does not exist" in str(missing[0].message)


def test_a_tuning_database_is_read_without_write_access(tmp_path, monkeypatch):
    """A database on a read-only mount: reading took a lock file beside it ([Errno 30] on its
    .lock). Root ignores permission bits here, so the mount's answer is stood in for."""
    db = tmp_path / "db.jsonl"
    db.write_text("")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if mode & os.W_OK else real_access(p, mode))
    assert len(TuningDatabase(db)) == 0
    assert not (tmp_path / "db.jsonl.lock").exists()


def test_from_torch_says_what_it_needs():
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(8, 8)
    with pytest.raises(TypeError, match="example_inputs is a list of float with no torch.Tensor"):
        relax_cutlass.from_torch(model, [1.0] * 8)
    with pytest.raises(TypeError, match="example_inputs is a ndarray"):
        relax_cutlass.from_torch(model, __import__("numpy").zeros((2, 8), "float32"))
    with torch.device("meta"):
        on_meta = torch.nn.Linear(8, 8)
    with pytest.raises(ValueError, match="weights are on the meta device .* first 'weight'"):
        relax_cutlass.from_torch(on_meta, torch.zeros(2, 8))


def test_a_compile_log_records_each_source(monkeypatch, tmp_path):
    """RELAX_CUTLASS_COMPILE_LOG: each compile appends what it compiled, for how long and whether the
    object came from the cache (bench/build_times.py reads it)."""
    import json

    from relax_cutlass.toolkit.compile import Source, compile_all

    log = tmp_path / "compile.jsonl"
    monkeypatch.setenv("RELAX_CUTLASS_COMPILE_LOG", str(log))
    monkeypatch.setenv("RELAX_CUTLASS_CACHE_DIR", str(tmp_path / "cache"))
    source = Source("log_probe", 'extern "C" int relax_cutlass_log_probe() { return 1; }\n', "host")
    compile_all([source], 80)
    compile_all([source], 80)
    first, second = (json.loads(line) for line in log.read_text().splitlines())
    assert first["name"] == second["name"] == "log_probe" and first["kind"] == "host"
    assert (first["cached"], second["cached"]) == (False, True) and first["compile_s"] > 0
