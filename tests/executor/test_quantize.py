"""Weight-only int8: the quantiser against its formula, the kernel against a float64 oracle, the quantised model
in every decoder (greedy identity with int8 plain decoding, the exact next-token law), bad input, and SmolLM2.

Q4_1: the file's own 4-bit blocks decoded exactly as ggml does (``gguf.quants`` as the oracle, on synthetic
blocks and on every Q4_1 tensor of the embedded SmolLM2 file), the int4 kernel against a float64 product of
those weights, row slices, and every greedy decoder on a Q4_1 model against Q4_1 plain decoding."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

import executor.quantize as quantize_module
from executor.decoders import AutoregressiveDecoder, ChainDecoder, Sampling
from executor.drafters import PromptLookupDrafter
from executor.model import Linear
from executor.quantize import (
    QUANTIZE_NAMES,
    Int8Linear,
    Q41Linear,
    int4_unsupported_reason,
    int8_linear,
    int8_unsupported_reason,
    q4_1_blocks,
    quantize_int8,
    quantize_model,
    resolve_quantize,
)
from executor.training.checkpoint import model_fingerprint
from tests.executor import test_decoders, test_drafters_feature
from tests.tiny_models import build_tiny_model


def previous_bfloat16(value: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(value, torch.zeros_like(value))


def test_quantize_int8_follows_its_formula_on_every_row():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 48, generator=generator) * torch.logspace(-3, 2, 64)[:, None]
    weight[5] = 0.0  # an all-zero row
    weight[7, 3] = -weight[7].abs().max() * 2  # the row's extreme is negative
    q, scales = quantize_int8(weight)
    assert q.dtype == torch.int8 and scales.dtype == torch.bfloat16 and q.shape == weight.shape
    exact = weight.abs().amax(1) / 127
    for row in range(64):
        s = scales[row].float()
        if exact[row] == 0:
            assert s == 1 and (q[row] == 0).all()
            continue
        # s is the smallest bfloat16 >= max|W| / 127 ...
        assert s >= exact[row] and previous_bfloat16(scales[row]).float() < exact[row]
        # ... Q is W / s rounded to the nearest integer, so the error is at most s / 2, and the extreme hits 127.
        torch.testing.assert_close(q[row].float(), torch.round(weight[row] / s), atol=0, rtol=0)
        assert (weight[row] - s * q[row].float()).abs().max() <= s / 2 + 1e-7 * s
        assert q[row].abs().max() >= 126
    assert q[7, 3] < 0 and q.abs().max() <= 127


def test_int8_linear_equals_the_dequantised_product_in_float64():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(40, 64, generator=generator)
    layer = Int8Linear(weight)
    x = torch.randn(2, 3, 64, generator=generator)
    out = layer(x)
    assert out.shape == (2, 3, 40) and out.dtype == torch.float32
    # The oracle: bfloat16 activations times Q * s, summed in float64, rounded to bfloat16 once.
    oracle = (x.bfloat16().double() @ layer.dequantized().double().T).bfloat16().float()
    error = (out - oracle).abs()
    assert (error <= 2 * 2**-8 * oracle.abs() + 1e-6).all()  # two bfloat16 ulps (summation order)
    # Negative control: the float weight itself is further away than the rounding allows somewhere.
    unquantised = (x.double() @ weight.double().T).float()
    assert not ((out - unquantised).abs() <= 2**-9 * unquantised.abs()).all()
    # Output rows: a slice equals the same rows of the full product, and the module keeps the input dtype.
    torch.testing.assert_close(layer(x, slice(10, 30)), out[..., 10:30], atol=0, rtol=0)
    assert layer(x.bfloat16()).dtype == torch.bfloat16


def test_int8_linear_rejects_nothing_silently_and_quantize_int8_rejects_bad_weights():
    with pytest.raises(ValueError, match="weight must be a 2-D floating tensor"):
        quantize_int8(torch.ones(3, dtype=torch.float32))
    with pytest.raises(ValueError, match="weight must be a 2-D floating tensor"):
        quantize_int8(torch.ones(3, 4, dtype=torch.int8))
    # A float32 copy of the scales (e.g. after model.float()) gives the same product.
    layer = Int8Linear(torch.randn(8, 16))
    x = torch.randn(3, 16)
    torch.testing.assert_close(int8_linear(x, layer.weight, layer.scales.float()), layer(x), atol=0, rtol=0)


def test_quantize_model_swaps_every_linear_and_keeps_the_embedding(tiny_model):
    model = quantize_model(tiny_model(0, tie_embeddings=False))
    assert model.quantization == "int8" and isinstance(model.quantized_head, Int8Linear)
    for layer in model.layers:
        for module in (
            layer.attention.wqkv,
            layer.attention.wo,
            layer.feed_forward.w13,
            layer.feed_forward.w2,
        ):
            assert isinstance(module, Int8Linear)
    assert model.tok_embeddings.weight.dtype == torch.float32 and isinstance(model.output, Linear)
    # The int8 head is made from the output weight (untied), not from the embedding.
    torch.testing.assert_close(
        model.quantized_head.dequantized(),
        model.output.weight,
        atol=model.quantized_head.scales.max().item(),
        rtol=0,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_logits_are_near_float_and_the_fingerprint_is_the_float_models(tiny_model, dtype):
    float_model = tiny_model(5, vocab_size=16).to(dtype)
    float_model.setup_cache(64)
    model = quantize_model(copy.deepcopy(float_model))
    model.setup_cache(64)
    tokens, slots = torch.tensor([[1, 5, 2, 9, 3, 3, 7]]), torch.arange(7)
    reference = float_model(tokens, slots).softmax(-1)
    probs = model(tokens, slots).softmax(-1)
    tv = 0.5 * (probs - reference).abs().sum(-1)
    assert tv.max() < 0.05 and tv.max() > 0  # close to the float model, and really a different model
    assert model_fingerprint(model) == model_fingerprint(float_model)
    # Incremental decoding on the int8 model equals its own full forward (the cache holds the same K/V).
    last = model(tokens[:, -1:], slots[-1:])
    model.setup_cache(64)
    model(tokens[:, :-1], slots[:-1])
    torch.testing.assert_close(model(tokens[:, -1:], slots[-1:]), last, atol=0, rtol=0)


def test_quantize_errors_are_value_errors_naming_the_problem(tiny_model, monkeypatch):
    assert set(QUANTIZE_NAMES) == {"none", "int8", "q4_1"}
    assert resolve_quantize(None) is None and resolve_quantize("none") is None
    assert resolve_quantize("int8") == "int8" and resolve_quantize("q4_1") == "q4_1"
    with pytest.raises(ValueError, match="--quantize must be one of none, int8, q4_1, got 'int4'"):
        resolve_quantize("int4", name="--quantize")
    model = quantize_model(tiny_model(0))
    with pytest.raises(ValueError, match="already quantised"):
        quantize_model(model)
    with pytest.raises(ValueError, match="model must be an executor.model.Transformer"):
        quantize_model(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="save the float model"):
        from executor.weights import save_safetensors

        save_safetensors(model, "/nonexistent/never-written")
    assert int8_unsupported_reason("cpu") is None
    monkeypatch.setitem(quantize_module._PROBED, "cpu", "_weight_int8pack_mm is not available: no kernel")
    with pytest.raises(ValueError, match="not supported on cpu .*no kernel"):
        quantize_model(tiny_model(0))


def test_the_probe_reports_a_missing_kernel(monkeypatch):
    def missing(*args):
        raise RuntimeError("Could not run '_weight_int8pack_mm' with arguments from the 'Meta' backend\nmore")

    monkeypatch.setattr(quantize_module, "_PROBED", {})
    monkeypatch.setattr(torch.ops.aten, "_weight_int8pack_mm", missing)
    reason = int8_unsupported_reason("cpu")
    assert reason.startswith("_weight_int8pack_mm is not available: Could not run") and "\n" not in reason


def int8_tiny(tiny_model, seed: int, **config):
    return quantize_model(tiny_model(seed, **config))


def assert_every_decoder_equals_plain_decoding(target, decoders: dict) -> None:
    """Greedy: each decoder's 40 tokens are plain decoding's on three prompts, and each really drafted."""
    for prompt in ([5], [1, 2, 3, 4], [7, 7, 1, 9, 7, 7]):
        reference = AutoregressiveDecoder(target).generate(prompt, 40).token_ids
        for name, decoder in decoders.items():
            result = decoder.generate(prompt, 40)
            assert result.token_ids == reference, name
            assert any(len(step.tokens) > 1 for step in result.steps), name


def test_every_greedy_decoder_on_the_int8_model_equals_int8_plain_decoding(tiny_model):
    target = int8_tiny(tiny_model, 21, vocab_size=16, max_seq_len=128)
    draft_model = int8_tiny(tiny_model, 22, vocab_size=16, max_seq_len=128)
    decoders = {
        **test_decoders.greedy_decoders(target, draft_model),
        **{f"feature-{k}": v for k, v in test_drafters_feature.greedy_decoders(target).items()},
        "chain-ngram": ChainDecoder(target, PromptLookupDrafter(), gamma=3),
    }
    assert_every_decoder_equals_plain_decoding(target, decoders)


def test_an_int8_verification_pass_gives_bitwise_the_logits_of_one_token_passes(tiny_model):
    """rowwise_attention: a chain pass and a tree pass over n tokens equal n one-token passes exactly."""
    model = int8_tiny(tiny_model, 31, vocab_size=16, max_seq_len=64)
    assert model.rowwise_attention
    prompt, chain = [3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5, 8]
    with torch.no_grad():
        model(torch.tensor([prompt]), torch.arange(8))
        batched = model(torch.tensor([chain]), torch.arange(8, 12))[0]
        single = [model(torch.tensor([[t]]), torch.tensor([8 + i]))[0, 0] for i, t in enumerate(chain)]
        assert torch.equal(batched, torch.stack(single))
        # A tree: node 0 is the root, nodes 1 and 2 its children, node 3 a child of 2 (slots 8..11).
        parents = [-1, 0, 0, 2]
        mask = torch.zeros(4, 12, dtype=torch.bool)
        mask[:, :8] = True
        for node, parent in enumerate(parents):
            mask[node, 8 + node] = True
            while parent >= 0:
                mask[node, 8 + parent], parent = True, parents[parent]
        depth = torch.tensor([8, 9, 9, 10])
        tree = model(torch.tensor([chain]), torch.arange(8, 12), positions=depth, attention_mask=mask)[0]
        # The path 0 -> 2 -> 3 decoded one token at a time, in contiguous slots.
        path = [
            model(torch.tensor([[chain[n]]]), torch.tensor([8 + i]))[0, 0] for i, n in enumerate([0, 2, 3])
        ]
    assert torch.equal(tree[[0, 2, 3]], torch.stack(path))


@pytest.mark.slow  # 1000 generations, like the float decoders' law tests
def test_chain_decoding_on_the_int8_model_reproduces_the_int8_models_exact_law(tiny_model):
    target = quantize_model(test_decoders.flat_tiny_model(tiny_model, 3))
    draft = quantize_model(test_decoders.flat_tiny_model(tiny_model, 4))
    law = test_decoders.exact_law(target, Sampling(temperature=1.0))
    float_law = test_decoders.exact_law(
        test_decoders.flat_tiny_model(tiny_model, 3), Sampling(temperature=1.0)
    )
    decoder = test_decoders.make_decoder("chain-model", target, draft)
    samples = test_decoders.sample_outcomes(decoder, seed=11)
    assert test_decoders.outcome_p_value(samples, law) > test_decoders.P_THRESHOLD
    assert 0.5 * abs(law - float_law).sum() > 0  # the int8 law is its own


def int8_greedy_deviations(model, prompt: list[int], output: list[int]) -> list[tuple[int, float, float]]:
    """Positions where ``output`` is not the int8 model's argmax given its prefix: (index, gap to the top, top).

    The int8 LM head returns bfloat16 logits (steps of 0.25 near 33), so logits within one bfloat16 step
    (2**-7 of the top: bfloat16 keeps 7 fraction bits) are ties that the summation order of a differently
    shaped product may flip, and three-way ties occur; a decoder is greedy if every deviation is such a
    near-tie (the float decoders' rule, at bfloat16 resolution).
    """
    tokens = prompt + output
    model.setup_cache(len(tokens))
    with torch.no_grad():
        logits = model(torch.tensor([tokens[:-1]]), torch.arange(len(tokens) - 1))[0, len(prompt) - 1 :]
    top = logits.max(-1).values
    deviations = []
    for index, token in enumerate(output):
        if token != int(logits[index].argmax()):
            value = float(top[index])
            deviations.append((index, value - float(logits[index, token]), value))
    return deviations


@pytest.mark.slow
def test_int8_smollm_chain_decoders_equal_int8_plain_decoding():
    from executor.drafters import EarlyExitDrafter
    from executor.weights import load_model
    from experiments.prompts import humaneval_prompts

    model, tokenizer = load_model(device="cpu", dtype=torch.float32, quantize="int8")
    assert model.quantization == "int8"
    for text in humaneval_prompts(2):
        prompt = tokenizer.encode(text)
        reference = AutoregressiveDecoder(model).generate(prompt, 24).token_ids
        assert len(reference) == 24
        for index, gap, top in int8_greedy_deviations(model, prompt, reference):
            assert gap <= 2**-7 * abs(top), f"token {index} leaves int8 greedy decoding (gap {gap:.2e})"
        for decoder in (
            ChainDecoder(model, PromptLookupDrafter(), gamma=4),
            ChainDecoder(model, EarlyExitDrafter(model, 10), gamma=2),
        ):
            # Row-by-row attention makes every pass's logits those of plain decoding: no tie may break apart.
            assert decoder.generate(prompt, 24).token_ids == reference
    # Negative control: sampled tokens are not argmaxes, and the check says so.
    prompt = tokenizer.encode(humaneval_prompts(1)[0])
    sampled = AutoregressiveDecoder(model, sampling=Sampling(temperature=1.5)).generate(
        prompt, 16, generator=torch.Generator().manual_seed(0)
    )
    with pytest.raises(AssertionError):
        for _, gap, top in int8_greedy_deviations(model, prompt, sampled.token_ids):
            assert gap <= 2**-7 * abs(top)


def test_the_cli_choices_and_generate_agree_with_the_quantize_names(tiny_model):
    from executor.generate import generate
    from experiments.commands import QUANTIZE_CHOICES

    assert QUANTIZE_CHOICES == QUANTIZE_NAMES
    with pytest.raises(ValueError, match=r"quantize 'int8' differs from the given model's \(none\)"):
        generate("x", model=tiny_model(0), tokenizer=object(), quantize="int8")
    with pytest.raises(ValueError, match="quantize must be one of none, int8"):
        generate("x", quantize="int4")


# --------------------------------------------------------------------------------------------------------
# Q4_1: the GGUF file's own blocks

Q4_1 = GGMLQuantizationType.Q4_1


def ggml_q4_1(weight: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """``gguf``'s own Q4_1 quantisation of ``weight`` (raw uint8 rows) and its own dequantisation (float32)."""
    raw = quantize(weight.numpy(), Q4_1)
    return raw, torch.from_numpy(dequantize(raw, Q4_1).reshape(weight.shape).astype(np.float32))


def test_q4_1_blocks_decode_to_ggmls_dequantisation_bitwise():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 256, generator=generator) * torch.logspace(-3, 1, 40)[:, None]
    weight[3] = 0.0  # an all-zero row: d = 0
    weight[4, :32] = 0.7  # a constant block
    raw, reference = ggml_q4_1(weight)
    assert raw.shape == (40, 256 // 32 * 20)
    q, d, m = q4_1_blocks(raw)
    assert q.dtype == torch.uint8 and q.shape == (40, 256) and int(q.max()) <= 15
    assert d.shape == m.shape == (40, 8) and d.dtype == m.dtype == torch.float16
    # w = d q + m per block, in float32: the formula, and the kernel's weights, are gguf's numbers bitwise.
    formula = q.float() * d.float().repeat_interleave(32, 1) + m.float().repeat_interleave(32, 1)
    assert torch.equal(formula, reference)
    assert torch.equal(Q41Linear(q, d, m).dequantized(), reference)
    # Negative controls: swapped nibble halves, or the float weight itself, are not those numbers.
    swapped = torch.cat([q[:, 16:32], q[:, :16], q[:, 32:]], 1)
    assert not torch.equal(Q41Linear(swapped, d, m).dequantized(), reference)
    assert not torch.equal(weight, reference)
    with pytest.raises(ValueError, match="raw must be uint8 Q4_1 rows of a multiple of 20 bytes"):
        q4_1_blocks(raw[:, :-1])
    with pytest.raises(ValueError, match=r"q, d, m must be \(out, in\)"):
        Q41Linear(q[:, :250], d, m)


def test_the_int4_kernel_equals_the_float64_product_of_the_dequantised_weights():
    """Float32 accumulation over in = 256: within 8 float32 ulps of sum |x| |w| of the exact product."""
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(200, 256, generator=generator)
    raw, dequantised = ggml_q4_1(weight)
    layer = Q41Linear(*q4_1_blocks(raw))
    for shape in [(1, 256), (3, 256), (2, 5, 256), (17, 256)]:
        x = torch.randn(*shape, generator=generator)
        out = layer(x)
        assert out.shape == (*shape[:-1], 200) and out.dtype == torch.float32
        exact = x.double() @ dequantised.double().T
        scale = x.double().abs() @ dequantised.double().abs().T
        assert ((out.double() - exact).abs() <= 8 * 2**-24 * scale).all()
        # Negative control: the unquantised weight is thousands of ulps away.
        unquantised = x.double() @ weight.double().T
        assert ((out.double() - unquantised).abs() > 8 * 2**-24 * scale).any()
    # One row of a batch is the product of that row alone (the decoders' one-token passes).
    x = torch.randn(7, 256, generator=generator)
    assert torch.equal(layer(x)[3], layer(x[3:4])[0])
    # Output rows: any slice equals the same rows of the full product (inside a packing block or across).
    full = layer(x)
    for rows in (
        slice(0, 200),
        slice(16, None),
        slice(48, 100),
        slice(64, None),
        slice(128, 150),
        slice(5, 33),
    ):
        assert torch.equal(layer(x, rows), full[:, rows]), rows
    # bfloat16 scales and activations: within a bfloat16 rounding of the exact product.
    low = Q41Linear(*q4_1_blocks(raw), dtype=torch.bfloat16)
    out = low(x.bfloat16())
    assert out.dtype == torch.bfloat16
    exact = x.bfloat16().double() @ dequantised.double().T
    scale = x.double().abs() @ dequantised.double().abs().T
    assert ((out.double() - exact).abs() <= 2**-6 * scale).all()


def q4_1_tiny(seed: int, **config):
    """A tiny model whose 2-D weights are ``gguf``-quantised to Q4_1 and back (the float model that the file's
    dequantised weights make), and that model on the blocks themselves: ``(float model, Q4_1 model)``."""
    float_model = build_tiny_model(seed, dim=32, hidden_dim=64, **config)
    model = build_tiny_model(seed, dim=32, hidden_dim=64, **config)
    state, blocks = model.state_dict(), {}
    for name, weight in state.items():
        if weight.ndim == 2 and (name != "tok_embeddings.weight" or model.output is None):
            raw, state[name] = ggml_q4_1(weight)
            blocks[name] = q4_1_blocks(raw)
    float_model.load_state_dict(state)
    model.load_state_dict(state)
    return float_model, quantize_model(model, "q4_1", blocks=blocks)


def test_a_q4_1_model_is_the_float_model_of_its_dequantised_weights(tiny_model):
    float_model, model = q4_1_tiny(5, vocab_size=16, tie_embeddings=False)
    assert model.quantization == "q4_1" and not model.rowwise_attention
    assert isinstance(model.quantized_head, Q41Linear) and isinstance(
        model.layers[1].feed_forward.w2, Q41Linear
    )
    assert model.tok_embeddings.weight.dtype == torch.float32
    assert model_fingerprint(model) == model_fingerprint(float_model)
    tokens, slots = torch.tensor([[1, 5, 2, 9, 3, 3, 7]]), torch.arange(7)
    for m in (float_model, model):
        m.setup_cache(64)
    torch.testing.assert_close(model(tokens, slots), float_model(tokens, slots), atol=1e-5, rtol=1e-5)
    # Negative control: the tiny model's own float weights give other logits.
    original = tiny_model(5, dim=32, hidden_dim=64, vocab_size=16, tie_embeddings=False)
    assert (original(tokens, slots) - float_model(tokens, slots)).abs().max() > 1e-2
    with pytest.raises(ValueError, match="blocks must hold the Q4_1 tensors"):
        quantize_model(tiny_model(0), "q4_1")
    assert int4_unsupported_reason("cpu") is None
    assert int4_unsupported_reason("meta") == "_weight_int4pack_mm_for_cpu is a CPU kernel"


def test_every_greedy_decoder_on_the_q4_1_model_equals_q4_1_plain_decoding():
    _, target = q4_1_tiny(21, vocab_size=16, max_seq_len=128)
    _, draft_model = q4_1_tiny(22, vocab_size=16, max_seq_len=128)
    decoders = {
        **test_decoders.greedy_decoders(target, draft_model),
        **{f"feature-{k}": v for k, v in test_drafters_feature.greedy_decoders(target).items()},
    }
    assert_every_decoder_equals_plain_decoding(target, decoders)


@pytest.mark.slow
def test_every_q4_1_tensor_of_the_embedded_file_is_ggmls_dequantisation_bitwise():
    from executor.weights import default_model_path, read_gguf_q4_1

    config, state, _, blocks = read_gguf_q4_1(default_model_path())
    assert len(blocks) >= 30 * 7  # every projection of every layer (and the head if the file stores it so)
    # Every shape and role (q, k, v, o, gate, up, down, and any tensor outside the layers) in the first and
    # the last layer: the layers share their shapes, and each tensor costs ~1.2 s on a Xeon (its product with
    # the identity runs on ATen's scalar float32 4-bit kernel); all 210 took ~4 minutes of CI.
    checked = {f"layers.{i}." for i in (0, config.n_layers - 1)}
    sample = {
        name: value
        for name, value in blocks.items()
        if not name.startswith("layers.") or any(name.startswith(prefix) for prefix in checked)
    }
    assert len(sample) >= 2 * 7
    for name, (q, d, m) in sample.items():
        # state holds gguf.quants.dequantize of the same tensor (rows un-permuted the same way).
        assert torch.equal(Q41Linear(q, d, m).dequantized(), state[name]), name


@pytest.mark.slow
def test_q4_1_smollm_chain_decoders_equal_q4_1_plain_decoding():
    from executor.drafters import EarlyExitDrafter
    from executor.weights import load_model
    from experiments.prompts import humaneval_prompts

    torch.set_num_threads(1)
    model, tokenizer = load_model(device="cpu", dtype=torch.float32, quantize="q4_1")
    assert model.quantization == "q4_1"
    # A short prompt and 12 tokens: with float32 activations the 4-bit kernel is scalar (~0.35 s per row on
    # an Intel Xeon, a 125-token HumanEval prefill took 29 s); the decoders' bookkeeping is the same as on the
    # float and int8 models tested at length. Both outcomes are exercised: on this prompt the lookup's drafts
    # are all rejected, and the exit at layer 27 of 30 has 5 of its drafts accepted in 7 steps (2026-11-28).
    prompt = tokenizer.encode(humaneval_prompts(1)[0])[-12:]
    reference = AutoregressiveDecoder(model).generate(prompt, 12).token_ids
    assert len(reference) == 12
    accepted = []
    for decoder in (
        ChainDecoder(model, PromptLookupDrafter(), gamma=4),
        ChainDecoder(model, EarlyExitDrafter(model, 27), gamma=2),
    ):
        result = decoder.generate(prompt, 12)
        assert result.token_ids == reference
        accepted.append(sum(len(step.accepted_path) - 1 for step in result.steps))
    assert accepted[1] > 0  # the accepting path is covered too
