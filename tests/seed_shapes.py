"""The seed shapes of the peer tables (benchmarks/peers), shared by the tests."""
NORMAL_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
NORMAL = [(m, n, k) for m in (64, 128, 4096) for n, k in NORMAL_NK] + [(4096, 7168, 576)]
GROUPED_NK = [(4096, 7168), (7168, 2048)]
CONTIGUOUS = [(g, m, n, k) for g, m in ((4, 8192), (8, 4096)) for n, k in GROUPED_NK]  # m = rows per group
MASKED = [(g, m, n, k) for g, m in ((1, 1024), (2, 512), (4, 256)) for n, k in GROUPED_NK]  # m = expected_m
