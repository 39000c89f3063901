"""The fixed facts configs are built within: GEMM kinds, the kernel's K block, pipeline caps, register budgets."""
from __future__ import annotations

# Hopper's shared memory per block and the contiguous layout's group alignment, for the other config modules.
from ..device import SM90_MAX_SMEM_PER_BLOCK  # noqa: F401
from ..layout import M_ALIGNMENT_FOR_CONTIGUOUS_LAYOUT as M_ALIGNMENT  # noqa: F401


KIND_NORMAL, KIND_CONTIGUOUS, KIND_MASKED = 0, 1, 2
KIND_NAMES = {KIND_NORMAL: "normal", KIND_CONTIGUOUS: "contiguous", KIND_MASKED: "masked"}
#: Kinds whose kernel has a stream-K tail (the contiguous layout's scheduler has none).
STREAM_K_KINDS = (KIND_NORMAL, KIND_MASKED)

#: K extent of one pipeline stage and of one scale block.
BLOCK_K = 128
#: Tile heights the kernel instantiates; 192 runs three math warpgroups of one m64 sub-tile each.
BLOCK_MS = (64, 128, 192, 256)
THREE_WG_BLOCK_M = 192

#: The kernel's __align__(1024) extern shared-memory declaration reserves this much static smem.
STATIC_SMEM = 1024
MAX_STAGES = 8
# Interleaved K (two warpgroups on alternate K blocks) drains the pipeline twice as fast: up to 12 stages for tiles of
# at most 64 K blocks, whose run is short next to the memory latency after a dirty-L2 flush. There 64x4096x7168 and
# 128x4096x7168 (56 K blocks) took 1.0-1.5 us less with 12 than with 8; 64x7168x16384 (128 K blocks) 0.5-0.9 us
# more, with B first to evict or not (benchmarks/NOTES.md, "Pipeline depth and the L2 flush"; between 56 and 128 not
# measured).
MAX_STAGES_INTERLEAVE_K = 12
DEEP_INTERLEAVE_K_MAX_K_BLOCKS = 64
# A CTA running several tiles keeps at most one tile's K blocks in flight (but 3 or more): with 8 stages on 4 K blocks
# the producer requests its second tile whole before the first one's data arrives, and after a dirty-L2 flush
# 64x32768x512 took ~1 us longer than with 3-6 (benchmarks/NOTES.md, "Pipeline depth and the L2 flush").
MIN_STAGES_MULTI_TILE = 3

# setmaxnreg budgets (64 x 1024 registers, one CTA per SM): the producer warpgroup hands registers to the math ones.
PRODUCER_REGS_TWO_WG, MATH_REGS_TWO_WG = 40, 232  # 128 x 40 + 256 x 232 = 64 x 1024
PRODUCER_REGS_THREE_WG, MATH_REGS_THREE_WG = 24, 160  # 128 x 24 + 384 x 160 <= 64 x 1024
MATH_REGS_ONE_WG = 255  # no setmaxnreg: 256 threads x 255
# Registers the math loop needs besides accumulators (addresses, scales, loop state): 64 in general, 40 where tiles
# do not straddle scale blocks, 32 for 192-row tiles (192x128, 64 + 64 accumulators, compiles at 160 without spills).
OTHER_REGS = 64
OTHER_REGS_LEAN = 40
OTHER_REGS_THREE_WG = 32

# The widest interleaved-K tile: 64x184 (wider ones split their wgmma) spills registers in its rolled K loop under
# NVRTC 12.9 and 13.5 (13.0 does not); the model never picks it (a scan of normal and masked problems,
# benchmarks/NOTES.md, "Interleaved K").
INTERLEAVE_K_MAX_BLOCK_N = 176

# Raster stripes (cuda_src/scheduler.cuh): a stripe of N blocks is swept over every row block before the next stripe
# starts. 16 blocks per stripe, as DeepGEMM's scheduler groups them; with A multicast a scheduling unit is a pair of
# blocks, so 8 units. Against 16 pairs (32 blocks), 16 blocks measured up to 3.7 % faster on the M = 4096 seed shapes,
# 0-11 % on the masked ones and 0.3-3.2 % on 9 of 12 contiguous layouts on an H100, and about the same or a little
# less on an H200; slower by 0.6-2.2 % on two contiguous seed layouts with K = 2048 and one other (benchmarks/NOTES.md,
# "Raster stripes").
RASTER_N_BLOCKS = 16


def kind_id(kind: int | str) -> int:
    """The kind's id from its id or name ("normal", "contiguous", "masked"); ValueError otherwise."""
    if isinstance(kind, str):
        for kid, name in KIND_NAMES.items():
            if name == kind:
                return kid
        raise ValueError(f"kind: expected one of {list(KIND_NAMES.values())}, got {kind!r}")
    if kind not in KIND_NAMES:
        raise ValueError(f"kind: expected one of {list(KIND_NAMES)}, got {kind!r}")
    return kind
