"""Deterministic cluster simulation helpers."""

from loomfs.testing.sim.history import Op, Verdict, check_chunk_history, check_final_state

__all__ = ["Op", "Verdict", "check_chunk_history", "check_final_state"]
