"""What relax_cutlass's tests, benchmarks, scripts and tutorials share, above the library.

- `harness`: an offloaded module run on the CPU, each extern served by its region's llvm-built
  composite, against the untouched module; `errors.rel_error`, the one error measure.
- `models`: small Relax model builders, and PyTorch / transformers models imported as users do.
- `graphs`, `norm_graphs`, `attention`: random graphs and attention forms for the property tests.
- `gpu_*`, `suite_cases`: the GPU suite's cases, builds and checks (torch on the GPU host).
- `zoo`: the model zoo's registry (real torchvision and transformers models) and how its results
  are judged.
- `parallel`: a tensor-parallel group simulated on the CPU (a thread per rank, the all-reduces
  summed in numpy).
- `gelu16`: the fit of the 16-bit GELU's polynomial, and its error over every fp16 input.

The library never imports this package (tests/test_layers.py checks it).
"""
