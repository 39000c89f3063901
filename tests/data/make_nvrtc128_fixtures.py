"""Regenerate tests/data/nvrtc128_lb*.cubin: the sass test kernel built by NVRTC 12.8 (which emits no FFMA
interleave), so the golden interleave test runs where that old NVRTC is not installed.

  pip install --target .nvrtc128 nvidia-cuda-nvrtc-cu12==12.8.93
  CUPYGEMM_NVRTC_DIRS=.nvrtc128 python tests/data/make_nvrtc128_fixtures.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import sass_helpers as H  # noqa: E402

builds = H.builds_cuda128()
if not builds:
    raise SystemExit("NVRTC 12.8 not found (see the docstring)")
for b in builds:
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"nvrtc128_lb{b.launch_threads}.cubin")
    with open(path, "wb") as f:
        f.write(b.cubin)
    print(path, len(b.cubin))
