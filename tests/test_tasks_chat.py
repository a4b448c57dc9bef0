from relaxspec.tasks import chat


def test_training_prompts_are_distinct_and_disjoint_from_heldout():
    train = chat.training_prompts(len(chat._TEMPLATES) * len(chat._SUBJECTS))
    assert len(set(train)) == len(train) > 900
    assert not set(train) & set(chat.HELDOUT)
    heldout_text = " ".join(chat.HELDOUT).lower()
    # no training subject appears in a held-out prompt
    assert [s for s in chat._SUBJECTS if s.lower() in heldout_text] == []
    assert len(chat.HELDOUT) == len(set(chat.HELDOUT)) == 20


def test_training_prompts_are_seeded():
    assert chat.training_prompts(50, seed=1) == chat.training_prompts(50, seed=1)
    assert chat.training_prompts(50, seed=1) != chat.training_prompts(50, seed=2)
