"""Triton kernels of the gated delta rule (`kernels.gdn`, imported only when the Triton backend is
asked for) and the packed offsets' rule every backend shares (`kernels.offsets`, torch only)."""
