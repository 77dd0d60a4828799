"""The decoders, one module each, sharing the decoding state, the KV-cache handling and the step loop."""

from executor.decoders.autoregressive import AutoregressiveDecoder
from executor.decoders.base import Decoder, DecodingState, DraftTree, PrefillCache, Sampling, run_tree
from executor.decoders.chain import ChainDecoder, ConfidenceStop
from executor.decoders.falcon_tree import falcon_tree
from executor.decoders.multidraft import MultiDraftDecoder
from executor.decoders.tree import TREE_VERIFIERS, DynamicTree, TreeDecoder, default_tree

__all__ = [
    "AutoregressiveDecoder",
    "ChainDecoder",
    "ConfidenceStop",
    "Decoder",
    "DecodingState",
    "DraftTree",
    "DynamicTree",
    "MultiDraftDecoder",
    "PrefillCache",
    "Sampling",
    "TREE_VERIFIERS",
    "TreeDecoder",
    "default_tree",
    "falcon_tree",
    "run_tree",
]
