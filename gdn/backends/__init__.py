"""Core backends under test, by name: the protocol (`base`), the built-ins (`builtin`) and the
lookup through entry points and `module:function` (`registry`). Nothing here imports Triton, FLA
or FlashQLA: each backend imports its code when it is first called."""

from gdn.backends.base import Backend, CapabilityCheck, CoreFn, supports_everything
from gdn.backends.builtin import BUILTINS, FLA_FLASH_QLA_ENV
from gdn.backends.registry import ENTRY_POINT_GROUP, as_backend, get_backend, registered_backends

__all__ = [
    "BUILTINS",
    "ENTRY_POINT_GROUP",
    "FLA_FLASH_QLA_ENV",
    "Backend",
    "CapabilityCheck",
    "CoreFn",
    "as_backend",
    "get_backend",
    "registered_backends",
    "supports_everything",
]
