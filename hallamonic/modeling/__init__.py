"""The Hallamonic model: the flat folder of remote code copied into every checkpoint."""

from .configuration_hallamonic import HallamonicConfig
from .hallamonic_scan import scan, scan_step
from .modeling_hallamonic import HallamonicForCausalLM, HallamonicModel, HarmonicBlock

__all__ = ["HallamonicConfig", "HallamonicForCausalLM", "HallamonicModel", "HarmonicBlock", "scan", "scan_step"]
