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
    # normal 64x2112x7168: split-K over 3 CTAs, one warpgroup, tiles straddling B scale blocks
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
    # masked 4x256x7168x2048: K loop compiled per scale-block boundary offset
    "masked-128x144-boundary": dict(SHAPE_N=7168, SHAPE_K=2048, BLOCK_N=144, WGMMA_N=144, NUM_STAGES=5,
                                    SWIZZLE_D=32, RASTER_N=8, KIND=2, MULTICAST=1, A_BOX_M=64,
                                    CLUSTER_ATTR=_CLUSTER),
}

# sha256 (first 16 hex digits) of each config's kernel .text, per NVRTC (major, minor): 13.5 (CI's), 13.0 (the GPU
# image's, where the kernels are measured), 12.9 and 12.8 (cupy-cuda12x installs). The code whose kernels were last
# benchmarked on the GPU (the producer on one lane, benchmarks/NOTES.md 31); scripts/sass_diff.py --nvrtc checks the
# others.
PINNED_HASHES = {
    (13, 5): {
        'normal-128x128': 'c76cab0285b83720',
        'normal-64x48-split3': '5e0884225800e4aa',
        'normal-64x64-interleave-mcB': 'b5ab6725b99bf281',
        'normal-192x128-3wg-mcA': 'cc965f4cadba0c7d',
        'contiguous-256x128-serial': '6723603c45c01a5a',
        'masked-256x128-streamk': '742af0392eac8662',
        'masked-128x144-boundary': 'da50aa75899743a9',
    },
    (13, 0): {
        'normal-128x128': '8cc9960f1b79039d',
        'normal-64x48-split3': '07bdd8c854d0cd77',
        'normal-64x64-interleave-mcB': 'fe2037279f54d3d3',
        'normal-192x128-3wg-mcA': 'b84553d46696f6f7',
        'contiguous-256x128-serial': '24b06182f4cc899d',
        'masked-256x128-streamk': 'ec70359c17583b4d',
        'masked-128x144-boundary': '705fc790afb0a511',
    },
    (12, 9): {
        'normal-128x128': '00e6575a6a091b5d',
        'normal-64x48-split3': 'aabe52323ef064c3',
        'normal-64x64-interleave-mcB': '47a531bc866c026b',
        'normal-192x128-3wg-mcA': '70d877ad820fb31c',
        'contiguous-256x128-serial': '5a94894348dc437f',
        'masked-256x128-streamk': 'ab6af999ced5b34c',
        'masked-128x144-boundary': 'dff37f631e9d0296',
    },
    (12, 8): {
        'normal-128x128': 'cf1fad20c34165db',
        'normal-64x48-split3': 'aabe52323ef064c3',
        'normal-64x64-interleave-mcB': 'ddc2566817808655',
        'normal-192x128-3wg-mcA': 'd26646516f5d1198',
        'contiguous-256x128-serial': '76ad668ee64b8b88',
        'masked-256x128-streamk': 'eb6cf4037aa6e972',
        'masked-128x144-boundary': 'f200c1dbb698ea5e',
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
