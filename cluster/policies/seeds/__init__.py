"""Paper 003 App. F's seed and evolved policies as candidate files for policy search.

Each file defines one policy class between OpenEvolve's EVOLVE-BLOCK markers and can be
passed anywhere a policy spec is accepted (`--retention PATH`, `evaluate(PATH)`):

- `ttl_seed.py` (Listing 1): TTL retention, tau = 2 s (Continuum).
- `evolved_retention.py` (Listing 2, Eq. 7): per-tool EMA gap estimate, scaled with the
  context length and shortened as KV utilization rises.
- `plas_seed.py` (Listing 3): PLAS scheduling (Autellix).
- `evolved_scheduling.py` (Listing 4, Eq. 8): sqrt of attained service, a context-length
  term and a residency bonus.
"""

from pathlib import Path

SEEDS_DIR = Path(__file__).resolve().parent
