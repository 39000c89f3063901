"""Kernel configuration: tile, pipeline depth, schedule and grid of a GEMM, chosen by a small cost model.

* :mod:`.constants`: GEMM kinds, the kernel's K block, stage caps and register budgets;
* :mod:`.legality`: :class:`GemmConfig` and :func:`make_config` (which configs the kernel can run);
* :mod:`.cost`: the cost model (estimated time of a tile, schedule and problem);
* :mod:`.choice`: :func:`choose` (the one choice over named candidates, measured rules and overrides) and
  :func:`choose_config`, its memoized entry;
* :mod:`.overrides`: :func:`override_config`, forced fields for tuning.

What other modules use is re-exported here.
"""
from __future__ import annotations

from .choice import (B_EVICT_FIRST_ENV, M_CLASS_ROWS, b_evict_first, b_evict_first_rule, candidate_block_ms,
                     candidate_tiles, choose, choose_config, clear_memo, fewest_ctas_for_rounds, m_class, memo_info,
                     model_rows, split_k_tile)
from .constants import (BLOCK_K, KIND_CONTIGUOUS, KIND_MASKED, KIND_NAMES, KIND_NORMAL, M_ALIGNMENT,
                        RASTER_N_BLOCKS, SM90_MAX_SMEM_PER_BLOCK, STREAM_K_KINDS, THREE_WG_BLOCK_M, kind_id)
from .cost import Estimate, estimate, interleave_k_pays, interleave_k_regime, stream_k_tail
from .legality import (GemmConfig, default_raster_n, interleave_k_fits, make_config, multicast_options,
                       output_swizzle, serial_m_possible, side_aware_config, split_k_extent, wgmma_n_for)
from .overrides import config_version, override_config

__all__ = [
    "B_EVICT_FIRST_ENV", "BLOCK_K", "Estimate", "GemmConfig", "KIND_CONTIGUOUS", "KIND_MASKED", "KIND_NAMES",
    "KIND_NORMAL", "M_ALIGNMENT", "M_CLASS_ROWS", "RASTER_N_BLOCKS", "SM90_MAX_SMEM_PER_BLOCK", "STREAM_K_KINDS",
    "THREE_WG_BLOCK_M", "b_evict_first", "b_evict_first_rule", "candidate_block_ms", "candidate_tiles", "choose",
    "choose_config", "clear_memo", "config_version", "default_raster_n", "estimate", "fewest_ctas_for_rounds",
    "interleave_k_fits", "interleave_k_pays", "interleave_k_regime", "kind_id", "m_class", "make_config", "memo_info",
    "model_rows", "multicast_options", "output_swizzle", "override_config", "serial_m_possible", "side_aware_config",
    "split_k_extent", "split_k_tile", "stream_k_tail", "wgmma_n_for",
]
