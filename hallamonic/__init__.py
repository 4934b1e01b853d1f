"""hallamonic: turn a pretrained Llama-family LLM into an attention-free hierarchical SSM.

Public API:
    scan, scan_step                          -- the diagonal linear recurrence (hallamonic.modeling)
    HallamonicConfig, HallamonicForCausalLM  -- the Hugging Face model (self-contained remote code)
"""

from hallamonic.modeling.hallamonic_scan import scan, scan_step

__all__ = ["scan", "scan_step"]
__version__ = "0.1.0"
