"""fusekit's pattern tables, one module per family. Ships as ``fusion_backend.patterns``."""
from .attention import PATTERNS as ATTENTION
from .batched_matmul import PATTERNS as BATCHED_MATMUL
from .elementwise import PATTERNS as ELEMENTWISE
from .quantize import PATTERNS as QUANTIZE

# Order matters where rules overlap: a longer chain must be tried before its own suffix.
PATTERNS = [*ATTENTION, *BATCHED_MATMUL, *QUANTIZE, *ELEMENTWISE]
