"""The GEMM kernel's machine code stays what was measured: the instruction streams of a few configs, covering the
kernel's features, are pinned by hash (NVRTC on the CPU, no GPU needed).

A failure here means an edit of cuda_src/ (or a new NVRTC) changed the SASS of at least one config. That may be
fine, but it is a performance change until shown otherwise: run ``python scripts/sass_diff.py --base <last pinned
revision>`` to see which chosen configs changed and by how much, benchmark the changed ones on a GPU against the
previous revision (``cupygemm bench``), and only then re-pin with ``python scripts/sass_diff.py --pin`` (it prints the
PINNED_HASHES entry for the NVRTC in use).
"""
from __future__ import annotations

import hashlib

import pytest

from cupygemm.jit.build import build_cubin
from cupygemm.jit.compiler import nvrtc_version
from cupygemm.jit.source import render
from sass_tools.elf import Cubin

ENTRY = "cupygemm_fp8_gemm"

# The kernel's constants (cupygemm's config renders the same keys), spelled out here so the pins do not move when
# the chooser or the config's field names change. Each config is a chosen one of the seed shapes or decode batches.
_BASE = dict(SHAPE_N=4096, SHAPE_K=7168, BLOCK_M=128, BLOCK_N=128, WGMMA_N=128, NUM_STAGES=4, NUM_MATH_WG=2,
             MATH_REGS=232, PRODUCER_REGS=40, SWIZZLE_D=128, RASTER_N=16, KIND=0, MULTICAST=0, INTERLEAVE_K=0,
             SERIAL_M=0, SPLIT_K=1, STREAM_K=0, A_BOX_M=128, CLUSTER_ATTR="")
_CLUSTER = "__cluster_dims__(2, 1, 1)"
PINNED_CONFIGS = {
    # normal 128x32768x512: the plain two-warpgroup kernel
    "normal-128x128": dict(SHAPE_N=32768, SHAPE_K=512),
    # split-K over 3 CTAs, one warpgroup, tiles straddling B scale blocks (64x200x3000 runs these)
    "normal-64x48-split3": dict(SHAPE_N=2112, BLOCK_M=64, BLOCK_N=48, WGMMA_N=48, NUM_STAGES=8, NUM_MATH_WG=1,
                                MATH_REGS=255, SWIZZLE_D=32, A_BOX_M=64, SPLIT_K=3),
    # normal 128x4096x7168: interleave_k, B multicast
    "normal-64x64-interleave-mcB": dict(BLOCK_M=64, BLOCK_N=64, WGMMA_N=64, NUM_STAGES=12, A_BOX_M=64,
                                        MULTICAST=2, CLUSTER_ATTR=_CLUSTER, INTERLEAVE_K=1),
    # normal 4096x24576x1536: three math warpgroups, A multicast
    "normal-192x128-3wg-mcA": dict(SHAPE_N=24576, SHAPE_K=1536, BLOCK_M=192, NUM_MATH_WG=3, MATH_REGS=160,
                                   PRODUCER_REGS=24, RASTER_N=8, MULTICAST=1, A_BOX_M=96, CLUSTER_ATTR=_CLUSTER),
    # contiguous 4x8192x4096x7168: 256-row tiles (half tiles), serial m64 sub-tiles
    "contiguous-256x128-serial": dict(BLOCK_M=256, NUM_STAGES=3, RASTER_N=8, KIND=1, MULTICAST=1, SERIAL_M=1,
                                      CLUSTER_ATTR=_CLUSTER),
    # masked 1x1024x4096x7168: stream-K tail, 64-row A boxes
    "masked-256x128-streamk": dict(BLOCK_M=256, NUM_STAGES=3, RASTER_N=8, KIND=2, MULTICAST=1, SERIAL_M=1,
                                   STREAM_K=1, A_BOX_M=64, CLUSTER_ATTR=_CLUSTER),
    # normal 64x32768x512: one warpgroup, 128 wide, two accumulator sets
    "normal-64x128-1wg-2acc": dict(SHAPE_N=32768, SHAPE_K=512, BLOCK_M=64, NUM_MATH_WG=1, MATH_REGS=255, A_BOX_M=64,
                                   TWO_ACC_SETS=1),
    # normal 128x2112x7168: split-K clusters of two, two accumulator sets
    "normal-128x32-cluster-2acc": dict(SHAPE_N=2112, BLOCK_N=32, WGMMA_N=32, NUM_STAGES=8, SWIZZLE_D=64, SPLIT_K=2,
                                       CLUSTER_ATTR=_CLUSTER, SPLIT_CLUSTER=1, TWO_ACC_SETS=1),
    # masked 4x256x7168x2048: K loop compiled per scale-block boundary offset
    "masked-128x144-boundary": dict(SHAPE_N=7168, SHAPE_K=2048, BLOCK_N=144, WGMMA_N=144, NUM_STAGES=5,
                                    SWIZZLE_D=32, RASTER_N=8, KIND=2, MULTICAST=1, A_BOX_M=64,
                                    CLUSTER_ATTR=_CLUSTER),
}

# sha256 (first 16 hex digits) of each config's kernel .text, per NVRTC (major, minor): 13.5 (CI's), 13.0 (the GPU
# image's, where the kernels are measured), 12.9 and 12.8 (cupy-cuda12x installs). The code whose kernels were last
# benchmarked on the GPU (A's tail box, benchmarks/NOTES.md, "A tail box"); `scripts/sass_diff.py --pin [--nvrtc LIB]`
# prints them.
PINNED_HASHES = {
    (13, 5): {
        'normal-128x128': 'd51836da3731ba83',
        'normal-64x48-split3': 'ad205e9952b1f237',
        'normal-64x64-interleave-mcB': 'f46e74bb33a75165',
        'normal-192x128-3wg-mcA': 'f7737f6e1b400b88',
        'contiguous-256x128-serial': '0c395a5b074a20fe',
        'masked-256x128-streamk': '6239646ef14507a0',
        'normal-64x128-1wg-2acc': 'a39cc6bd17a6dd21',
        'normal-128x32-cluster-2acc': 'ec76c48ece1b0d9b',
        'masked-128x144-boundary': '1dd3d92f1d7b7334',
    },
    (13, 0): {
        'normal-128x128': '912f5cd27f4947fd',
        'normal-64x48-split3': '335a6b5e78e01c71',
        'normal-64x64-interleave-mcB': '04d1c52f722463f7',
        'normal-192x128-3wg-mcA': '738e8568a78e2180',
        'contiguous-256x128-serial': '875b71d26ec2f128',
        'masked-256x128-streamk': '3354ad8681146cb8',
        'normal-64x128-1wg-2acc': '191da68730cdb4a9',
        'normal-128x32-cluster-2acc': 'a7d7d4902ed5957f',
        'masked-128x144-boundary': 'c4a189cd38bfb19f',
    },
    (12, 9): {
        'normal-128x128': 'e4c716c38e4f4b1d',
        'normal-64x48-split3': '07e1fea5f443bd35',
        'normal-64x64-interleave-mcB': '4f5424affaa883d5',
        'normal-192x128-3wg-mcA': '6a42da6acbab42c6',
        'contiguous-256x128-serial': 'acb00fd3bc2b1347',
        'masked-256x128-streamk': '9d23039f787bae10',
        'normal-64x128-1wg-2acc': '3e3678d3cac05c5a',
        'normal-128x32-cluster-2acc': 'caee48aa469c6901',
        'masked-128x144-boundary': 'a367f100a8700180',
    },
    (12, 8): {
        'normal-128x128': '436524724a9e77ab',
        'normal-64x48-split3': '07e1fea5f443bd35',
        'normal-64x64-interleave-mcB': 'ed61b7ebdfc1ee41',
        'normal-192x128-3wg-mcA': '06a4430dc445bbc6',
        'contiguous-256x128-serial': '3307f708a91091a9',
        'masked-256x128-streamk': '2a4f68d70041c3c5',
        'normal-64x128-1wg-2acc': '3e3678d3cac05c5a',
        'normal-128x32-cluster-2acc': '89dd4bbe65514e5c',
        'masked-128x144-boundary': '8444301554b3cb8b',
    },
}


def pinned_defines(name: str) -> dict[str, object]:
    return {f"CUPYGEMM_{k}": v for k, v in {**_BASE, **PINNED_CONFIGS[name]}.items()}


def instruction_hash(name: str) -> str:
    """Hash of the kernel's instruction stream (its .text section: no symbol names, addresses or source text)."""
    _, cubin = build_cubin(render("fp8_gemm.cu", ENTRY, pinned_defines(name)), post_process=False)
    cb = Cubin.from_bytes(cubin)
    return hashlib.sha256(cb.read_text(cb.kernel(ENTRY))).hexdigest()[:16]


def test_every_pinned_config_has_a_hash():
    version = nvrtc_version()
    if version not in PINNED_HASHES:
        pytest.fail(f"no SASS pins for NVRTC {version[0]}.{version[1]} (pinned: {sorted(PINNED_HASHES)}): a new "
                    f"compiler changes the kernel's code, so benchmark it on a GPU, then add its pins with "
                    f"`python scripts/sass_diff.py --pin`")
    assert set(PINNED_HASHES[version]) == set(PINNED_CONFIGS)


@pytest.mark.parametrize("name", sorted(PINNED_CONFIGS))
def test_instruction_stream_is_pinned(name):
    version = nvrtc_version()
    pins = PINNED_HASHES.get(version)
    if pins is None:
        pytest.fail(f"no SASS pins for NVRTC {version[0]}.{version[1]}: see test_every_pinned_config_has_a_hash")
    got = instruction_hash(name)
    assert got == pins[name], (
        f"the SASS of {name} changed (instruction-stream hash {got}, pinned {pins[name]}). A SASS change needs a GPU "
        f"benchmark showing no slowdown before it is re-pinned: run `python scripts/sass_diff.py` to list every "
        f"chosen config that changed, bench those on a GPU, then `python scripts/sass_diff.py --pin` prints the new "
        f"PINNED_HASHES entry for this file.")
