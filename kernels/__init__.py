"""Triton kernels of the gated delta rule. Imported only when the Triton backend is asked for."""
