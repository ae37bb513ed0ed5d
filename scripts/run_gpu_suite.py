"""The GPU suite on a host with only the TVM runtime, numpy and torch, from libraries built elsewhere
(scripts/build_gpu_suite.py --pack): the runtime-only path, kept until the in-process one
(tests/test_gpu_suite.py and bench/gpu_suite.py, on the GPU host with the whole TVM) has run on a
GPU. The checks and timers are bench/gpu_suite.py's.

    python scripts/run_gpu_suite.py build/gpu OUT_DIR [--only SECTION ...] [--match REGEX] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from gpu_suite import SECTIONS, run_sections  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("build", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile peers")
    ap.add_argument("--only", choices=SECTIONS, action="append", help="run only these sections")
    ap.add_argument("--match", default="", help="run only the cases whose name matches this regex")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds per benchmark case")
    args = ap.parse_args()
    manifest = json.loads((args.build / "manifest.json").read_text())
    if args.match:
        manifest = {k: [c for c in v if re.search(args.match, c["name"])] if isinstance(v, list) else v
                    for k, v in manifest.items()}  # fmt: skip
    only = set(args.only or SECTIONS)
    return 1 if run_sections(manifest, args.build, args.out, only, not args.no_compile, args.rounds) else 0


if __name__ == "__main__":
    sys.exit(main())
