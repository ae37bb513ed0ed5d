"""Build the GPU suite's libraries here (TVM compiler + nvcc, no GPU) for a GPU host with only the
TVM runtime (scripts/run_gpu_suite.py there): the runtime-only path, kept until the in-process one
(tests/test_gpu_suite.py, bench/gpu_suite.py) has run on a GPU. The cases and the build are
bench/gpu_suite.py's; this adds the manifest kept across calls and the archive to carry.

    python scripts/build_gpu_suite.py --arch sm_90a --out build/gpu [--only SECTION ...] [--pack]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from gpu_suite import SECTIONS, build_sections  # noqa: E402


def pack(out: Path, manifest: dict, sections: set[str]) -> None:
    """Write <out>.tar.xz holding only the sections built now: their libraries and a manifest of
    just those sections (what is carried to the GPU host is limited; xz dedupes the static CUDA
    runtime every library carries)."""
    stage = out.parent / f"{out.name}-pack"
    shutil.rmtree(stage, ignore_errors=True)
    (stage / out.name).mkdir(parents=True)
    packed = {"arch": manifest["arch"]} | {k: (v if k in sections else []) for k, v in manifest.items() if k != "arch"}
    (stage / out.name / "manifest.json").write_text(json.dumps(packed, indent=1))
    names = {case["name"] for key in sections for case in manifest.get(key, [])}
    for lib in out.iterdir():
        if lib.suffix == ".so" and lib.name.split(".", 1)[0] in names:
            os.link(lib, stage / out.name / lib.name)
    archive = out.with_suffix(".tar.xz")
    subprocess.run(f"tar -cf - -C {stage} {out.name} | xz -9 -T0 > {archive}", shell=True, check=True)
    shutil.rmtree(stage)
    print(f"wrote {archive} ({archive.stat().st_size / 2**20:.1f} MiB, sections {sorted(sections)})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--out", default=str(ROOT / "build" / "gpu"))
    ap.add_argument("--only", choices=SECTIONS, action="append")
    ap.add_argument("--pack", action="store_true", help="also write <out>.tar.xz: the sections built by this call")
    ap.add_argument("--tuning-db", default="", help="also build each case with this tuning database's kernels")
    ap.add_argument("--pack-existing", action="store_true", help="build nothing: pack the --only sections built")
    args = ap.parse_args()
    out = Path(args.out)
    only = set(args.only or SECTIONS)
    manifest_path = out / "manifest.json"
    manifest = {"arch": args.arch} | {k: [] for k in SECTIONS}
    if manifest_path.exists():  # rebuild only the sections asked for
        previous = json.loads(manifest_path.read_text())
        if previous.get("arch") == args.arch:
            manifest |= {k: previous.get(k, []) for k in SECTIONS if k not in only or args.pack_existing}
    if not args.pack_existing:
        built = build_sections(only, args.arch, out, args.tuning_db)
        manifest |= {k: v for k, v in built.items() if k in only or v}
        manifest_path.write_text(json.dumps(manifest, indent=1))
        print(f"wrote {manifest_path}")
    if args.pack or args.pack_existing:
        pack(out, manifest, only)


if __name__ == "__main__":
    main()
