"""`hyperqwen prepare`: download, requantize and verify the model (streaming, atomic, resumable)."""

from hyperqwen.prepare.cli import register
from hyperqwen.prepare.errors import PrepareError
from hyperqwen.prepare.options import PrepareOptions

__all__ = ["PrepareError", "PrepareOptions", "register"]
