"""``policy.freeze_film`` (OFT+ with its towers frozen): the FiLM maps stay fixed too, so RL cannot change how the words
modulate the towers' features; without it OFT+'s own recipe trains the maps and nothing else of the towers."""

from __future__ import annotations

import pytest

pytest.importorskip("mani_skill")


def _trainable_vision(*more: str) -> tuple[set[str], set[str]]:
    from vlarl.experiments import training_policy

    _, _, policy = training_policy(["experiment=multitask_oft_sft_rl", "env.tasks=[PushCubeToColor-v1]",
                                    "env.image_size=32", "+policy.arch.use_film=true", "policy.freeze_vision=true",
                                    *more], seed=0)
    vision = {n: p for n, p in policy.named_parameters() if "vision_backbone" in n}
    film_ids = {id(p) for p in policy.model.vision_backbone.film_parameters()}  # the backbone names its FiLM maps
    film = {n for n, p in vision.items() if id(p) in film_ids}
    trainable_rest = {n for n, p in policy.named_parameters() if p.requires_grad and "vision_backbone" not in n}
    assert film and trainable_rest  # the action head and the language model still learn either way
    return {n for n, p in vision.items() if p.requires_grad}, film


def test_freeze_film_keeps_the_film_maps_fixed_with_the_towers():
    trainable, _ = _trainable_vision("policy.freeze_film=true")
    assert trainable == set()


def test_without_it_only_the_film_maps_of_the_towers_train():
    trainable, film = _trainable_vision()
    assert trainable == film


def test_freeze_embeddings_keeps_the_words_film_reads_fixed():
    """FiLM's words are the average of the language model's input embeddings: with freeze_embeddings SFT and RL
    cannot move them away from what grounded pretraining saw; the rest of the language model still trains."""
    from vlarl.experiments import training_policy

    def embedding_trains(*more: str) -> tuple[bool, bool]:
        _, _, policy = training_policy(["experiment=multitask_oft_sft_rl", "env.tasks=[PushCubeToColor-v1]",
                                        "env.image_size=32", "+policy.arch.use_film=true", *more], seed=0)
        lm = policy.model.language_model
        table = lm.get_input_embeddings().weight
        rest = any(p.requires_grad for p in lm.parameters() if p is not table)
        return table.requires_grad, rest

    assert embedding_trains() == (True, True)
    assert embedding_trains("policy.freeze_embeddings=true") == (False, True)
