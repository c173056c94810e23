"""Helpers for scripts that use posattn: :mod:`.timing` (median wall time, peak memory)."""
