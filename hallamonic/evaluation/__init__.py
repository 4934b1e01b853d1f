"""Evaluation of causal LMs against their fair baselines: LAMBADA, held-out loss by context
length, passkey retrieval (`hallamonic eval`).

Every task works on any `AutoModelForCausalLM`, converted Hallamonic checkpoints included, and
scores through one memory-safe function (`scoring.score_tokens`) so numbers are comparable.
"""

from hallamonic.evaluation.baselines import apply_rope_scaling
from hallamonic.evaluation.context import evaluate_context
from hallamonic.evaluation.lambada import evaluate_lambada
from hallamonic.evaluation.passkey import evaluate_passkey
from hallamonic.evaluation.runner import EvalOptions, run_evaluation
from hallamonic.evaluation.scoring import score_tokens

__all__ = [
    "EvalOptions",
    "apply_rope_scaling",
    "evaluate_context",
    "evaluate_lambada",
    "evaluate_passkey",
    "run_evaluation",
    "score_tokens",
]
