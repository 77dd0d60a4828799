"""specbound.executor: the reference speculative decoders, run on real llama-family models with torch.

The model (:mod:`executor.model`) is a small gpt-fast-style llama with a static KV cache; weights come from
GGUF or Hugging Face safetensors (:mod:`executor.weights`); the decoders (:mod:`executor.decoders`) share one
step loop (draft, score the draft tree in one target pass, verify, commit) and the torch twins of the theory
verifiers (:mod:`executor.verification`); every step is logged in a form :mod:`theory` consumes
(:mod:`executor.logs`). :func:`generate` is the one-call entry point.
"""

from executor.decoders import (
    AutoregressiveDecoder,
    ChainDecoder,
    DynamicTree,
    MultiDraftDecoder,
    Sampling,
    TreeDecoder,
)
from executor.device import default_dtype, detect_hardware, resolve_dtype, set_threads
from executor.drafters import EarlyExitDrafter, ModelDrafter, PromptLookupDrafter, parse_drafter
from executor.generate import build_decoder, generate
from executor.logs import GenerationResult, StepLog, step_distributions
from executor.model import ModelConfig, Transformer
from executor.quantize import Int8Linear, quantize_model
from executor.sampling import logits_to_probs, sample_drafts, sample_token
from executor.verification import verify_chain, verify_multidraft
from executor.weights import default_model_path, load_model

__all__ = [
    "AutoregressiveDecoder",
    "ChainDecoder",
    "DynamicTree",
    "EarlyExitDrafter",
    "GenerationResult",
    "Int8Linear",
    "ModelConfig",
    "ModelDrafter",
    "MultiDraftDecoder",
    "PromptLookupDrafter",
    "Sampling",
    "StepLog",
    "Transformer",
    "TreeDecoder",
    "build_decoder",
    "default_dtype",
    "default_model_path",
    "detect_hardware",
    "generate",
    "load_model",
    "logits_to_probs",
    "parse_drafter",
    "quantize_model",
    "resolve_dtype",
    "sample_drafts",
    "sample_token",
    "set_threads",
    "step_distributions",
    "verify_chain",
    "verify_multidraft",
]
