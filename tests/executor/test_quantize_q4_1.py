"""The Q4_1 path: the file's own 4-bit blocks decoded exactly as ggml does (``gguf.quants`` as the oracle, on
synthetic blocks and on every Q4_1 tensor of the embedded SmolLM2 file), the int4 kernel against a float64
product of those weights, row slices, and every greedy decoder on a Q4_1 model against Q4_1 plain decoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from executor.decoders import AutoregressiveDecoder, ChainDecoder
from executor.drafters import PromptLookupDrafter
from executor.quantize import Q41Linear, int4_unsupported_reason, q4_1_blocks, quantize_model
from executor.training.checkpoint import model_fingerprint
from tests.executor import test_decoders, test_drafters_feature
from tests.tiny_models import build_tiny_model

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
    for prompt in ([5], [1, 2, 3, 4], [7, 7, 1, 9, 7, 7]):
        reference = AutoregressiveDecoder(target).generate(prompt, 40).token_ids
        for name, decoder in decoders.items():
            result = decoder.generate(prompt, 40)
            assert result.token_ids == reference, name
            assert any(len(step.tokens) > 1 for step in result.steps), name  # it really drafted


@pytest.mark.slow
def test_every_q4_1_tensor_of_the_embedded_file_is_ggmls_dequantisation_bitwise():
    from executor.weights import default_model_path, read_gguf_q4_1

    _, state, _, blocks = read_gguf_q4_1(default_model_path())
    assert len(blocks) >= 30 * 7  # every projection of every layer (and the head if the file stores it so)
    for name, (q, d, m) in blocks.items():
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
    for text in humaneval_prompts(2):
        prompt = tokenizer.encode(text)
        reference = AutoregressiveDecoder(model).generate(prompt, 24).token_ids
        assert len(reference) == 24
        for decoder in (
            ChainDecoder(model, PromptLookupDrafter(), gamma=4),
            ChainDecoder(model, EarlyExitDrafter(model, 10), gamma=2),
        ):
            assert decoder.generate(prompt, 24).token_ids == reference
