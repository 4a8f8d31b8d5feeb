import json

import pytest
import torch

from policies.critics import Critic, CriticCheckpointError, ProcessRewardCritic

from .conftest import INSTRUCTION, tiny_config


def _frames(n, size=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, size, size, 3), generator=g, dtype=torch.uint8)


def test_forward_shapes_and_ranges(tiny_critic):
    a, b = _frames(3), _frames(3, seed=1)
    out = tiny_critic(a, b, [INSTRUCTION, "pick up the cube", "x"])
    assert out.progress.shape == (3,) and out.done_logit.shape == (3,)
    assert bool(((out.progress >= -1) & (out.progress <= 1)).all())
    assert bool(((out.done_prob > 0) & (out.done_prob < 1)).all())


def test_reference_frames_change_the_prediction(tiny_critic):
    a, b, ref = _frames(2), _frames(2, seed=1), _frames(3, seed=2)
    plain = tiny_critic(a, b, [INSTRUCTION] * 2).progress
    shared = tiny_critic(a, b, [INSTRUCTION] * 2, reference=ref).progress
    per_pair = tiny_critic(a, b, [INSTRUCTION] * 2, reference=ref.unsqueeze(0).expand(2, *ref.shape)).progress
    assert shared.shape == (2,)
    assert not torch.allclose(plain, shared)
    torch.testing.assert_close(shared, per_pair)


def test_frames_are_resized_to_the_critic_image_size(tiny_critic):
    out = tiny_critic(_frames(2, size=48), _frames(2, size=48, seed=1), [INSTRUCTION] * 2)
    assert out.progress.shape == (2,)


def test_batched_score_matches_one_big_batch(tiny_critic):
    a, b = _frames(7), _frames(7, seed=1)
    p1, d1 = tiny_critic.score(a, b, [INSTRUCTION] * 7, batch_size=3)
    p2, d2 = tiny_critic.score(a, b, [INSTRUCTION] * 7, batch_size=64)
    torch.testing.assert_close(p1, p2, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(d1, d2, atol=1e-5, rtol=1e-4)


def test_bad_inputs_give_one_line_errors(tiny_critic):
    with pytest.raises(ValueError, match="one per pair"):
        tiny_critic(_frames(2), _frames(2), [INSTRUCTION])
    with pytest.raises(ValueError, match=r"uint8 \[B, H, W, 3\]"):
        tiny_critic(_frames(2).permute(0, 3, 1, 2), _frames(2).permute(0, 3, 1, 2), [INSTRUCTION] * 2)
    with pytest.raises(ValueError, match="square number"):
        ProcessRewardCritic(tiny_config(tokens_per_frame=5))


def test_save_and_load_roundtrip(tiny_critic, tmp_path):
    d = tiny_critic.save_pretrained(tmp_path / "critic")
    names = {p.name for p in d.iterdir()}
    assert {"model.safetensors", "config.json", "processor_config.json", "tokenizer_config.json"} <= names
    meta = json.loads((d / "config.json").read_text())
    assert meta["critic"] == "vlm_process_reward"
    assert meta["vision_config"]["model_type"] == "siglip_vision_model" and meta["text_config"]["model_type"] == "qwen2"
    loaded = Critic.from_pretrained(d).eval()
    assert isinstance(loaded, ProcessRewardCritic)
    a, b = _frames(2), _frames(2, seed=1)
    torch.testing.assert_close(loaded(a, b, [INSTRUCTION] * 2).progress, tiny_critic(a, b, [INSTRUCTION] * 2).progress)


def test_missing_checkpoint_names_the_problem(tmp_path):
    with pytest.raises(CriticCheckpointError, match="reward.critic_path"):
        Critic.from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CriticCheckpointError, match="missing"):
        Critic.from_pretrained(tmp_path / "empty")


def test_builds_on_locally_saved_hugging_face_backbones(tmp_path):
    """vision_model / language_model load real HF checkpoints from disk (the tokenizer comes with the LM)."""
    from transformers import ByT5Tokenizer, LlamaConfig, LlamaModel, SiglipVisionConfig, SiglipVisionModel

    torch.manual_seed(1)
    vis = SiglipVisionModel(SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                               num_attention_heads=2, image_size=32, patch_size=8))
    tok = ByT5Tokenizer()
    lm = LlamaModel(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                num_attention_heads=2, num_key_value_heads=1))
    vis.save_pretrained(tmp_path / "vision")
    lm.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    critic = ProcessRewardCritic(tiny_config(vision_model=str(tmp_path / "vision"), language_model=str(tmp_path / "lm")))
    assert critic.lm.config.model_type == "llama"
    torch.testing.assert_close(critic.vision.state_dict()["embeddings.patch_embedding.weight"],
                               vis.state_dict()["embeddings.patch_embedding.weight"])
    out = critic(_frames(2), _frames(2, seed=1), [INSTRUCTION] * 2)
    assert out.progress.shape == (2,)
    loaded = Critic.from_pretrained(critic.save_pretrained(tmp_path / "saved"))
    assert loaded.lm.config.model_type == "llama"


def test_missing_backbone_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        ProcessRewardCritic(tiny_config(language_model=str(tmp_path / "absent")))
