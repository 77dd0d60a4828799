"""Training drafters on CPU in minutes: corpus, cached target features, trainer, checkpoint cards.

* :mod:`executor.training.corpus` -- the standard library (default) or a user corpus, split by file;
* :mod:`executor.training.features` -- the target's final hidden states on the corpus, prefilled once;
* :mod:`executor.training.trainer` -- time-budgeted, resumable AdamW on KL(p || q) (+ feature regression);
* :mod:`executor.training.checkpoint` -- safetensors weights + JSON card under the XDG cache directory;
* :mod:`executor.training.ranking` -- one yardstick for cached heads: per-file scores on a common held-out set.
"""

from executor.training.checkpoint import (
    cache_root,
    default_checkpoint_dir,
    load_checkpoint,
    model_fingerprint,
    save_checkpoint,
)
from executor.training.corpus import Corpus, default_corpus, is_held_out, load_corpus
from executor.training.features import FeatureSet, build_features, load_features, prepare_features
from executor.training.ranking import rank_checkpoints, score_checkpoint

__all__ = [
    "Corpus",
    "FeatureSet",
    "build_features",
    "cache_root",
    "default_checkpoint_dir",
    "default_corpus",
    "is_held_out",
    "load_checkpoint",
    "load_corpus",
    "load_features",
    "model_fingerprint",
    "prepare_features",
    "rank_checkpoints",
    "save_checkpoint",
    "score_checkpoint",
]
