"""hallamonic: turn a pretrained Llama-family LLM into an attention-free hierarchical SSM.

Public API:
    scan, scan_step                          -- the diagonal linear recurrence (hallamonic.modeling)
    HallamonicConfig, HallamonicForCausalLM  -- the Hugging Face model (self-contained remote code)
"""

__all__ = ["scan", "scan_step", "HallamonicConfig", "HallamonicForCausalLM"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """The public names load on first use: `import hallamonic` (and every submodule import,
    e.g. `hallamonic.data`) stays free of torch and transformers until the model is needed."""
    if name not in __all__:
        raise AttributeError(f"module 'hallamonic' has no attribute {name!r}")
    from hallamonic import modeling

    value = getattr(modeling, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
