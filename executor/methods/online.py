"""Online speculative decoding (OSD; Liu et al., "Online Speculative Decoding", ICML 2024, arXiv 2310.07177).

The drafter is distilled *while it serves*: every verification pass already computes the target's exact
features :math:`h_t` of the committed tokens (the feature drafter needs them anyway, they are kept in
:attr:`executor.decoders.base.DecodingState.hidden`), and the target's distribution there is one matrix
product away, :math:`p_{t+1} = \\mathrm{softmax}(W\\,\\mathrm{norm}(h_{t+1}))`. After each served prompt the
committed sequence (tokens and features) goes into a replay buffer of the last ``buffer_prompts`` prompts;
every ``update_every`` prompts the drafter takes ``steps`` AdamW steps on windows drawn from it, with the
offline trainer's objective (:func:`executor.training.trainer.feature_loss`: forward KL(p || q) at
temperature 1 plus the feature regression). OSD's released code takes one optimizer step on the buffered
requests every ``I`` requests (``I`` = 1 or 8) at a constant rate of 1e-4 and full fine-tuning of the draft;
here the draft is the trained feature head (:class:`executor.drafters.FeatureDrafter`) and its full weights
are updated.

Exactness is untouched: the drafter only proposes, chain verification (Leviathan et al., ICML 2023) accepts,
and an update happens between prompts, never inside a generation. The update's wall time is added to the
prompt's ``wall_time``, so a speedup already pays for the learning. The acceptance curve (drafted tokens
accepted per prompt, against prompts served) is in each result's ``extra``.

Departures: OSD restricts the loss to the positions where the target corrected the draft (plus the bonus);
this module distils on every position of windows ending in the generated text (OSD's T5 ``all_token_mask``
variant), which needs no bookkeeping of the corrected positions and uses all the target's distributions.
"""

from __future__ import annotations

import copy
import time

import torch

from executor.decoders import ChainDecoder
from executor.methods._common import checkpoint_cards, conditional_acceptance
from executor.methods.base import Method, Prediction
from theory.checks import as_count, as_nonnegative

__all__ = ["OnlineDistiller", "OnlineSpeculative", "ReplayBuffer"]


class _ServingChainDecoder(ChainDecoder):
    """Chain speculative sampling that keeps the last decoding state (its committed tokens and features)."""

    name = "online-chain"
    state = None

    def step(self, state, generator):
        self.state = state
        return super().step(state, generator)


class ReplayBuffer:
    """The last ``capacity`` served sequences: tokens ``(n,)`` and the target's features ``(n, d)``.

    ``sample`` draws windows of at most ``window`` tokens that end inside the generated part (after the
    prompt), so the updates follow the served distribution rather than the prompts.
    """

    def __init__(self, capacity: int, window: int) -> None:
        self.capacity = as_count(capacity, "buffer_prompts")
        self.window = as_count(window, "window", minimum=3)
        self.items: list[tuple[torch.Tensor, torch.Tensor, int]] = []

    def __len__(self) -> int:
        return len(self.items)

    def add(self, tokens: list[int], hidden: torch.Tensor, prompt_length: int) -> None:
        """Keep ``tokens[:n]`` with their features ``hidden[:n]`` (``n = len(hidden)``) if there are 3 or more."""
        n = min(len(tokens), hidden.shape[0])
        if n < 3:
            return
        self.items.append((torch.tensor(tokens[:n]), hidden[:n].detach().clone(), min(prompt_length, n - 1)))
        del self.items[: -self.capacity]

    def sample(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch`` windows of equal length: tokens ``(B, T)`` and features ``(B, T, d)``."""
        picks = torch.randint(len(self.items), (batch,), generator=generator).tolist()
        length = min(self.window, *(self.items[i][0].numel() for i in picks))
        tokens, hidden = [], []
        for i in picks:
            seq, features, prompt = self.items[i]
            low = max(length, prompt + 1)
            end = (
                int(torch.randint(low, seq.numel() + 1, (1,), generator=generator))
                if low <= seq.numel()
                else seq.numel()
            )
            tokens.append(seq[end - length : end])
            hidden.append(features[end - length : end])
        return torch.stack(tokens), torch.stack(hidden)


class OnlineDistiller:
    """AdamW on a float32 master copy of a :class:`FeatureDrafter`'s head; each update is copied back."""

    def __init__(self, drafter, *, lr: float, feature_weight: float = 0.5, fc_lr_scale: float = 0.1, seed=0):
        self.drafter = drafter
        self.master = copy.deepcopy(drafter.head).float().requires_grad_(True).train()
        groups = [
            {"params": list(self.master.fc.parameters()), "lr": lr * fc_lr_scale},
            {"params": list(self.master.layer.parameters()), "lr": lr},
        ]
        self.optimizer = torch.optim.AdamW(groups, lr=lr, weight_decay=0.0)
        self.feature_weight = feature_weight
        self.generator = torch.Generator().manual_seed(seed)
        self.losses: list[float] = []

    def update(self, buffer: ReplayBuffer, steps: int, batch: int) -> float:
        """``steps`` gradient steps on ``batch`` windows each; returns the seconds spent (copy-back included)."""
        from executor.training.trainer import feature_loss

        start = time.perf_counter()
        target = self.drafter.target
        with torch.enable_grad():
            for _ in range(steps):
                tokens, hidden = buffer.sample(batch, self.generator)
                hidden = hidden.to(target.tok_embeddings.weight.dtype)
                loss, kl = feature_loss(
                    self.master, target, hidden[:, :-1], tokens[:, 1:], hidden[:, 1:], self.feature_weight
                )
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.master.parameters(), 1.0)
                self.optimizer.step()
                self.losses.append(float(kl.detach()))
        with torch.no_grad():
            self.drafter.head.load_state_dict(self.master.state_dict())  # cast to the drafter's dtype
        return time.perf_counter() - start


class OnlineSpeculative(Method):
    """Chain speculative sampling with a feature drafter distilled online on the served prompts.

    Options: ``gamma`` (draft length, 4), ``update_every`` (prompts between updates, 1), ``steps`` (gradient
    steps per update, 4), ``batch`` (windows per step, 2), ``window`` (tokens per window, 64),
    ``buffer_prompts`` (replay capacity in prompts, 16), ``lr`` (1e-4, OSD's rate), ``head`` (a
    :class:`executor.drafters.FeatureHead`, a checkpoint directory, or ``None`` for the cached trained head of
    the target, else a fresh untrained head), ``learn`` (``False`` freezes the drafter: the control).
    """

    name = "online"
    paper = "Online speculative decoding, Liu et al., ICML 2024 (arXiv 2310.07177)"

    def __init__(
        self,
        target,
        tokenizer=None,
        *,
        gamma: int = 4,
        update_every: int = 1,
        steps: int = 4,
        batch: int = 2,
        window: int = 64,
        buffer_prompts: int = 16,
        lr: float = 1e-4,
        head=None,
        learn: bool = True,
        seed: int = 0,
    ):
        super().__init__(target, tokenizer)
        self.gamma = as_count(gamma, "gamma")
        self.update_every = as_count(update_every, "update_every")
        self.steps = as_count(steps, "steps", minimum=0)
        self.batch = as_count(batch, "batch")
        self.lr = as_nonnegative(lr, "lr")
        if self.lr == 0:
            raise ValueError("lr must be positive, got 0")
        if not isinstance(learn, bool):
            raise ValueError(f"learn must be True or False, got {learn!r}")
        self.learn = learn
        self.buffer = ReplayBuffer(buffer_prompts, window)
        self.drafter, self.head_source = _feature_drafter(target, head, seed)
        self.distiller = OnlineDistiller(self.drafter, lr=self.lr, seed=seed)
        self.served = 0
        self.curve: list[dict] = []
        self._decoder = None

    def drafter_cards(self) -> list[dict]:
        return checkpoint_cards(self.drafter)

    def options(self) -> dict:
        return {
            "gamma": self.gamma,
            "update_every": self.update_every,
            "steps": self.steps,
            "batch": self.batch,
            "window": self.buffer.window,
            "buffer_prompts": self.buffer.capacity,
            "lr": self.lr,
            "learn": self.learn,
            "head": self.head_source,
        }

    def build(self, temperature: float = 0.0):
        self._decoder = _ServingChainDecoder(
            self.target, self.drafter, gamma=self.gamma, sampling=self.sampling(temperature)
        )
        return self._decoder

    def run(self, prompt_ids, *, temperature=0.0, max_new_tokens=64, generator=None, eos_id=None):
        """Serve one prompt, then (every ``update_every`` prompts) update the drafter; the update is timed in."""
        result = super().run(
            prompt_ids,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            generator=generator,
            eos_id=eos_id,
        )
        state = self._decoder.state
        self.served += 1
        seconds = 0.0
        if state is not None:
            self.buffer.add(state.tokens, state.hidden[: state.committed], len(list(prompt_ids)))
        if self.learn and self.steps and len(self.buffer) and self.served % self.update_every == 0:
            seconds = self.distiller.update(self.buffer, self.steps, self.batch)
        # Each step emits its accepted drafts plus one target token; it verified the root plus its drafts.
        accepted = len(result.token_ids) - result.steps
        drafted = result.extra["verified_positions"] - result.steps
        point = {
            "served": self.served,
            "draft_acceptance": accepted / drafted if drafted else None,
            "tau": result.tau,
            "update_seconds": seconds,
            "generate_seconds": result.wall_time,
        }
        self.curve.append(point)
        result.wall_time += seconds
        result.extra.update(point)
        return result

    def warm_up(self, prompt_ids, temperature: float, max_new_tokens: int) -> None:
        """Generate without serving: no replay-buffer entry and no update (the stream stays as it was)."""
        Method.run(
            self,
            prompt_ids,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            generator=torch.Generator().manual_seed(0),
        )

    def predict(self, calibration_prompts, temperature, max_new_tokens):
        """Serve the calibration prompts (the stream's first prompts, updates on) and forecast the chain's
        tokens per step from their per-position acceptance, :func:`theory.expected_tokens`."""
        import theory

        runs = []
        for index, prompt in enumerate(calibration_prompts):
            runs.append(
                self.run(
                    prompt,
                    temperature=temperature,
                    max_new_tokens=max_new_tokens,
                    generator=torch.Generator().manual_seed(1000 + index),
                )
            )
        update_seconds = sum(result.extra["update_seconds"] for result in runs)
        if not runs:
            return Prediction(None, {"served": self.served})
        alphas = conditional_acceptance(runs, self.gamma)
        tau = float(theory.expected_tokens(alphas, self.gamma, per_position=True))
        details = {
            "acceptance_vector": alphas,
            "calibration_by_depth": alphas,
            "depth_aware": True,
            "served": self.served,
            "model": "expected_tokens(alphas)",
        }
        return Prediction(tau, details, train_seconds=update_seconds)


def _feature_drafter(target, head, seed: int):
    from executor.drafters import FeatureDrafter, FeatureHead

    if isinstance(head, FeatureHead):
        return FeatureDrafter(target, copy.deepcopy(head), name="feature:online"), "given"
    if head is not None:
        return FeatureDrafter.from_checkpoint(target, head, name="feature:online"), str(head)
    from executor.training.trainer import cached_checkpoints

    found = cached_checkpoints(target)
    if found:
        return FeatureDrafter.from_checkpoint(target, found[0], name="feature:online"), str(found[0])
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        fresh = FeatureHead(target.config)
    return FeatureDrafter(target, fresh, name="feature:online"), "untrained"
