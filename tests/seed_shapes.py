"""The seed shapes (cupygemm.shapes) as the tests use them: lists, and one more normal shape whose K (576) ends in
a partial 128-wide block, so the seed-config tests also cover a K tail."""
from cupygemm.shapes import CONTIGUOUS, GROUPED_NK, MASKED, NORMAL_NK  # noqa: F401
from cupygemm.shapes import NORMAL as SEED_NORMAL

NORMAL = [*SEED_NORMAL, (4096, 7168, 576)]
CONTIGUOUS = list(CONTIGUOUS)
MASKED = list(MASKED)
