"""The a-priori loop of ``specbound validate``: calibrate, predict before running, run, compare, plot.

One module per stage: :mod:`~experiments.apriori.calibrate` (acceptance and latency profiles from the
calibration half of the prompts), :mod:`~experiments.apriori.predict` (τ, acceptance by position and speedup
of every decoder configuration from the calibration alone), :mod:`~experiments.apriori.run` (the executor
runs, resumable), :mod:`~experiments.apriori.compare` (bootstrap intervals and the diagnosis of misses),
:mod:`~experiments.apriori.report` and :mod:`~experiments.apriori.plots`.
"""

from experiments.apriori.calibrate import (
    Calibration,
    LatencyProfile,
    RecordingDrafter,
    TimedDrafter,
    calibrate,
    event_record,
    read_latency,
    split_prompts,
)
from experiments.apriori.compare import bootstrap_ratio, bootstrap_speedup, diagnose, within_ci
from experiments.apriori.predict import DecoderConfig, Prediction, level_tree, plan_configurations, predict
from experiments.apriori.run import AprioriConfig, run_apriori

__all__ = [
    "AprioriConfig",
    "bootstrap_ratio",
    "bootstrap_speedup",
    "calibrate",
    "Calibration",
    "DecoderConfig",
    "diagnose",
    "event_record",
    "LatencyProfile",
    "level_tree",
    "plan_configurations",
    "predict",
    "Prediction",
    "read_latency",
    "RecordingDrafter",
    "TimedDrafter",
    "run_apriori",
    "split_prompts",
    "within_ci",
]
