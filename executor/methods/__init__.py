"""The seed papers' methods, one module each, behind one interface (:class:`Method`) and a registry by name.

``executor.methods.get(name)`` returns the method's class; ``get(name)(target, tokenizer, **options)`` builds
it on a model; ``names()`` lists the registered names. Every method has ``name``, ``lossless`` and ``paper``,
:meth:`Method.build(temperature) <Method.build>` (a decoder), :meth:`Method.predict` (the theory's tokens
per step from calibration prompts) and :meth:`Method.run` (a :class:`MethodResult`).

======================== ====================================================== ========
name                     paper                                                  lossless
======================== ====================================================== ========
``dyspec``               DySpec's greedy dynamic tree (arXiv 2410.11744)        yes
``sequoia``              Sequoia's static optimal tree (arXiv 2402.12374)       yes
``staged``               staged speculative decoding (arXiv 2308.04623)         yes
``staged-single``        staged's control: same drafter and tree, no draft²     yes
``easyspec``             EasySpec layer-parallel drafting (arXiv 2502.02493)    yes
``del``                  DEL dynamic exit layer (arXiv 2504.05598)              yes
``kangaroo``             Kangaroo double early exit, theory's eta (2404.18911)  yes
``kangaroo-fixed``       Kangaroo with the paper's fixed eta = 0.6              yes
``specdecpp``            SpecDec++ adaptive candidate length (2405.19715)       yes
``specdecpp-fixed``      SpecDec++'s baseline: the theory's best fixed K        yes
``specdecpp-heuristic``  transformers' heuristic schedule (+2 / -1)             yes
``code-completion``      dynamic inference for code completion (Sun et al.)     no
``online``               online speculative decoding, OSD (arXiv 2310.07177)    yes
``ppd``                  parallel prompt decoding, PPD (arXiv 2405.18628)       yes
======================== ====================================================== ========

Each method drafts with its paper's kind of trained drafter when one is cached for the target (docs/methods.md,
*Drafters by default*), else with the untrained early exit; each takes a ``drafter`` (or head) option.
"""

from __future__ import annotations

from executor.methods.base import LayerCounter, Method, MethodResult, Prediction
from executor.methods.code_completion import CodeCompletion
from executor.methods.del_exit import DEL
from executor.methods.dyspec import DySpec, DySpecDecoder, Sequoia
from executor.methods.easyspec import EasySpec
from executor.methods.kangaroo import Kangaroo, KangarooFixed
from executor.methods.online import OnlineSpeculative
from executor.methods.ppd import PPD
from executor.methods.specdecpp import SpecDecFixed, SpecDecHeuristic, SpecDecPP
from executor.methods.staged import Staged, StagedSingleStage

__all__ = [
    "LayerCounter",
    "Method",
    "MethodResult",
    "Prediction",
    "CodeCompletion",
    "DEL",
    "DySpec",
    "Kangaroo",
    "KangarooFixed",
    "OnlineSpeculative",
    "PPD",
    "SpecDecFixed",
    "SpecDecHeuristic",
    "SpecDecPP",
    "Staged",
    "StagedSingleStage",
    "DySpecDecoder",
    "EasySpec",
    "Sequoia",
    "get",
    "names",
]

_REGISTRY: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Add a :class:`Method` subclass to the registry under ``cls.name`` (a new name only)."""
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise ValueError(f"only Method subclasses can be registered, got {cls!r}")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"a method named {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls
    return cls


def names() -> list[str]:
    """The registered method names, in registration order."""
    return list(_REGISTRY)


def get(name: str) -> type[Method]:
    """The method class registered as ``name``; ``ValueError`` naming the known ones otherwise."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


for _cls in (
    DySpec,
    Sequoia,
    Staged,
    StagedSingleStage,
    EasySpec,
    DEL,
    Kangaroo,
    KangarooFixed,
    SpecDecPP,
    SpecDecFixed,
    SpecDecHeuristic,
    CodeCompletion,
    OnlineSpeculative,
    PPD,
):
    register(_cls)
