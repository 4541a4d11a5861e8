"""The shared-memory cleanup finds the regions of python_router models too, not only python's."""

from __future__ import annotations

from pathlib import Path

from tokenrouter.launch.shared_memory import SHM_DIR, SHM_PATTERN


def test_the_cleanup_pattern_matches_both_backends_regions_and_nothing_else() -> None:
    for region in ("triton_python_backend_shm_region_0f3a-9c", "triton_python_router_backend_shm_region_0f3a-9c"):
        assert (SHM_DIR / region).match(SHM_PATTERN), region
    for other in ("sem.triton_python_backend_shm_region_1", "triton_other_shm_region_1", "torch_1234"):
        assert not Path(SHM_DIR / other).match(SHM_PATTERN), other
