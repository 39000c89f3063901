"""The seed shapes (cupygemm.shapes) as the tests use them: lists, the normal ones with the K-tail shape added."""
from cupygemm.shapes import CONTIGUOUS, GROUPED_NK, K_TAIL_SHAPE, MASKED, NORMAL_NK  # noqa: F401
from cupygemm.shapes import NORMAL as SEED_NORMAL

NORMAL = [*SEED_NORMAL, K_TAIL_SHAPE]
CONTIGUOUS = list(CONTIGUOUS)
MASKED = list(MASKED)
