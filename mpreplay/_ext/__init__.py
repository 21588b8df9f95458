"""Compiled kernels (built from ext/)."""
