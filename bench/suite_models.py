"""Timing whole models in the GPU suite's benchmarks (bench/gpu_suite.py): one BERT-large layer,
ResNet-50 and the BERT-large encoder, relax_cutlass against TVM's build of the same graph with the
same weights (plain and with TVM's CUDA-graph rewrite), torch eager and torch.compile.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import tvm
from suite_timing import check_tuned, time_args, time_tuned, time_vm

from relax_cutlass.testing.errors import rel_error
from relax_cutlass.testing.gpu_checks import DEV, TOL_VS_TVM, call, device_args, inputs_for, load, run
from relax_cutlass.testing.gpu_common import time_torch


def torch_bert_layer(values: dict[str, np.ndarray], heads: int = 16):
    t = {k: torch.from_numpy(v).cuda() for k, v in values.items()}
    x = t["x"]
    bsz, seq, hidden = x.shape
    hd = hidden // heads

    def lin(inp, n):
        return F.linear(inp, t[f"{n}_w"], t[f"{n}_b"])

    def layer():
        q, k, v = (lin(x, n).view(bsz, seq, heads, hd).transpose(1, 2) for n in ("q", "k", "v"))
        probs = torch.softmax((q @ k.transpose(-1, -2)) * (1 / math.sqrt(hd)), dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(bsz, seq, hidden)
        h = F.layer_norm(lin(ctx, "o") + x, (hidden,), t["ln1_g"], t["ln1_b"])
        y = lin(F.gelu(lin(h, "ffn1")), "ffn2") + h
        return F.layer_norm(y, (hidden,), t["ln2_g"], t["ln2_b"])

    return layer


def _time_builds(row: dict, case: dict, build: Path, values: dict, vms: tuple, ref: np.ndarray) -> None:
    """relax_cutlass's build and TVM's (`vms`) timed, the tuned build too (checked against TVM's
    output `ref`) and the CUDA-graph builds where the case has them."""
    vm_c, vm_t = vms
    row["relax_cutlass_ms"] = time_vm(vm_c, case["cutlass_params"], values)
    if "tuned" in case.get("families", []):
        time_tuned(row, case, build, values)
        check_tuned(row, case, values, ref, "tvm")
    row["tvm_default_ms"] = time_vm(vm_t, case["tvm_params"], values)
    if case.get("cuda_graph"):
        _time_cuda_graphs(row, case, build, values)


def model_case(case: dict, build: Path, use_compile: bool) -> dict:
    values = inputs_for(case["tvm_params"], {}, 1)
    vm_c, vm_t = load(build / f"{case['name']}.cutlass.so"), load(build / f"{case['name']}.tvm.so")
    got, ref = run(vm_c, case["cutlass_params"], values), run(vm_t, case["tvm_params"], values)
    layer = torch_bert_layer(values)
    row = {
        "name": case["name"],
        "offloaded_regions": len(case["offloaded"]),
        "left_in_tvm": len(case["left_in_tvm"]),
        "err_vs_tvm": rel_error(got, ref),
        "err_vs_torch": rel_error(got, layer().float().cpu().numpy()),
    }
    row["ok"] = row["err_vs_tvm"] <= TOL_VS_TVM
    _time_builds(row, case, build, values, (vm_c, vm_t), ref)
    row["torch_eager_ms"] = time_torch(layer, repeat=10, number=10)
    if use_compile:
        row["torch_compile_ms"] = time_torch(torch.compile(layer), repeat=10, number=10)
    row["speedup_vs_tvm"] = row["tvm_default_ms"] / row["relax_cutlass_ms"]
    row["speedup_vs_torch_eager"] = row["torch_eager_ms"] / row["relax_cutlass_ms"]
    return row


def _end_to_end(case: dict, build: Path, use_compile: bool, details: dict, torch_peer) -> dict:
    """A whole model: relax_cutlass vs TVM's build of the same graph with the same weights (error,
    then times, tuned kernels too when built), vs `torch_peer(values) -> (module, input)` in torch
    eager and torch.compile."""
    values = inputs_for(case["tvm_params"], {}, 1)
    vm_c, vm_t = load(build / f"{case['name']}.cutlass.so"), load(build / f"{case['name']}.tvm.so")
    got, ref = run(vm_c, case["cutlass_params"], values), run(vm_t, case["tvm_params"], values)
    row = {"name": case["name"], **details, "err_vs_tvm": rel_error(got, ref)}
    row["ok"] = row["err_vs_tvm"] <= TOL_VS_TVM
    _time_builds(row, case, build, values, (vm_c, vm_t), ref)
    model, x = torch_peer(values)
    with torch.no_grad():
        row["torch_eager_ms"] = time_torch(lambda: model(x), repeat=10, number=10)
        if use_compile:
            compiled = torch.compile(model)
            row["torch_compile_ms"] = time_torch(lambda: compiled(x), repeat=10, number=10)
    if "flops" in case:
        row["relax_cutlass_tflops"] = case["flops"] / row["relax_cutlass_ms"] / 1e9
    row["speedup_vs_tvm"] = row["tvm_default_ms"] / row["relax_cutlass_ms"]
    row["speedup_vs_torch_eager"] = row["torch_eager_ms"] / row["relax_cutlass_ms"]
    if "torch_compile_ms" in row:
        row["speedup_vs_torch_compile"] = row["torch_compile_ms"] / row["relax_cutlass_ms"]
    return row


def _time_cuda_graphs(row: dict, case: dict, build: Path, values: dict) -> None:
    """Both builds again with TVM's CUDA-graph rewrite, checked and timed. A captured graph keeps
    the addresses of the weights (the parameters after `num_input`), so, as in deployment, the
    weight tensors are made once and reused; the input changes after capture (a replay must read
    the new one) and the result is checked against TVM's plain build."""
    ref_vm = load(build / f"{case['name']}.tvm.so")
    fresh = inputs_for(case["tvm_params"], {}, 2)
    for variant, params, key in (
        ("cutlass_graph", case["cutlass_params"], "relax_cutlass_graph_ms"),
        ("tvm_graph", case["tvm_params"], "tvm_graph_ms"),
    ):
        vm = load(build / f"{case['name']}.{variant}.so")
        args = device_args(params, values)
        call(vm, args)  # captures
        args[0] = tvm.runtime.tensor(fresh[params[0]["name"]], DEV)  # the model input; the rest are weights
        row[f"err_{variant}_vs_tvm"] = rel_error(call(vm, args), run(ref_vm, case["tvm_params"], fresh))
        row["ok"] = row["ok"] and row[f"err_{variant}_vs_tvm"] <= TOL_VS_TVM
        row[key] = time_args(vm, args)
    row["speedup_graph_vs_tvm"] = row["tvm_default_ms"] / row["relax_cutlass_graph_ms"]
    row["speedup_graph_vs_tvm_graph"] = row["tvm_graph_ms"] / row["relax_cutlass_graph_ms"]


def resnet_case(case: dict, build: Path, use_compile: bool) -> dict:
    """ResNet-50 end to end; torch runs the same architecture in fp16 channels_last."""
    convs = [r for r in case["offloaded"] if r["op"] == "conv2d"]
    details = {
        "batch": case["batch"],
        # Counted by call site: with weights as parameters, same-shaped convs share one function.
        "offloaded_regions": sum(r["calls"] for r in case["offloaded"]),
        "offloaded_convs": sum(r["calls"] for r in convs),
        "convs_with_fused_residual": sum(r["calls"] for r in convs if "residual" in r["epilogue"]),
        "convs_with_split_k": sum(r["calls"] for r in convs if r["conv"]["split_k"] > 1),
        "left_in_tvm": [r["op"] + ": " + "; ".join(r["reasons"]) for r in case["left_in_tvm"]],
    }

    def peer(values):
        from relax_cutlass.testing.models.torch_models import resnet50

        model = resnet50().half().cuda().to(memory_format=torch.channels_last)
        return model, torch.from_numpy(values["x"]).cuda().half().contiguous(memory_format=torch.channels_last)

    return _end_to_end(case, build, use_compile, details, peer)


def bert_case(case: dict, build: Path, use_compile: bool) -> dict:
    """The transformers BERT-large encoder end to end; torch runs transformers' BertEncoder (written
    in plain torch, relax_cutlass.testing.models.bert_encoder_torch; tests/test_models.py checks it is the
    same computation) in fp16 with its default sdpa attention."""
    details = {
        "batch": case["batch"],
        "seq": case["seq"],
        "layers": case["layers"],
        "offloaded_regions": sum(r["calls"] for r in case["offloaded"]),
        "regions_with_fused_gelu": sum(r["calls"] for r in case["offloaded"] if "gelu" in r["epilogue"]),
        "left_in_tvm": len(case["left_in_tvm"]),
        "offloaded_flop_fraction": case["offloaded_flops"] / case["flops"],
    }

    def peer(values):
        from relax_cutlass.testing.models.torch_transformers import bert_encoder_torch

        model = bert_encoder_torch(layers=case["layers"]).half().cuda()
        return model, torch.from_numpy(values[case["tvm_params"][0]["name"]]).cuda().half()

    return _end_to_end(case, build, use_compile, details, peer)


# (header, key, format) of the summary table printed last.
