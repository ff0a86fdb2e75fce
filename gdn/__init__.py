"""gdn: the system under test: the gated delta rule (backends by name), CP layouts, layer and model.

`import gdn` loads torch but never Triton or `kernels`: the Triton backend is imported on first use.
"""

from gdn.backends import Backend, get_backend, registered_backends
from gdn.cp import CPConfig
from gdn.layer import GatedDeltaNet, GDNLayerConfig
from gdn.ops import (
    GDNShape,
    UnsupportedGDNRequest,
    check_triton_gdn,
    gated_delta_rule,
    is_triton_gdn_available,
)
from gdn.reference import chunk_gated_delta_rule_eager, recurrent_gated_delta_rule

__all__ = [
    "Backend",
    "CPConfig",
    "GDNLayerConfig",
    "GDNShape",
    "GatedDeltaNet",
    "UnsupportedGDNRequest",
    "check_triton_gdn",
    "chunk_gated_delta_rule_eager",
    "gated_delta_rule",
    "get_backend",
    "is_triton_gdn_available",
    "recurrent_gated_delta_rule",
    "registered_backends",
]
