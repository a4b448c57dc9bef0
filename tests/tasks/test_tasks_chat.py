import re

from relaxspec.tasks import chat


def test_training_prompts_are_distinct_and_disjoint_from_heldout():
    train = chat.training_prompts(chat.pool_size())
    # ten times the first pool (32 templates x 279 subjects, which the shipped smollm2-drafter saw)
    assert len(set(train)) == len(train) == chat.pool_size() >= 10 * 8928
    assert not set(train) & set(chat.HELDOUT)
    heldout_text = " ".join(chat.HELDOUT).lower()
    # no training subject appears in a held-out prompt, and none sits near a held-out topic
    assert [s for s in chat._SUBJECTS if s.lower() in heldout_text] == []
    assert {"beekeeping", "tornadoes", "hurricanes"} <= set(chat.NEAR_HELDOUT)
    assert not set(chat._SUBJECTS) & set(chat.NEAR_HELDOUT)
    # nor does a template name one (as a whole subject: "light" in "light bulbs" is another subject)
    named = [near for near in chat.NEAR_HELDOUT for p in train
             if re.search(rf"(^|\s){re.escape(near)}([.,?!]|\s(and|or)\s)", p, re.IGNORECASE)]
    assert named == []
    assert len(chat.HELDOUT) == len(set(chat.HELDOUT)) == 20


def test_training_prompts_mix_one_subject_audiences_and_pairs():
    train = set(chat.training_prompts(chat.pool_size()))
    a, b = chat._SUBJECTS[0], chat._SUBJECTS[1]
    assert chat._TEMPLATES[0].format(s=a) in train
    assert chat._AUDIENCE_TEMPLATES[0].format(s=b, a=chat._AUDIENCES[0]) in train
    pairs = [p for p in train if any(p.startswith(t.split("{s}")[0]) and " and " in p for t in chat._PAIR_TEMPLATES[:2])]
    assert len(pairs) > 1000
    # a prefix of the shuffled pool holds every kind in proportion
    first = chat.training_prompts(5000)
    compare = sum(p.startswith("Compare ") for p in first)
    expected = 5000 * chat._PAIRS / len(chat._PAIR_TEMPLATES) / chat.pool_size()  # ~438
    assert abs(compare - expected) < 5 * expected ** 0.5


def test_training_prompts_are_seeded():
    assert chat.training_prompts(50, seed=1) == chat.training_prompts(50, seed=1)
    assert chat.training_prompts(50, seed=1) != chat.training_prompts(50, seed=2)


def test_more_prompts_than_the_pool_is_a_one_line_error(capsys, tmp_path):
    from relaxspec.cli import main

    n = chat.pool_size() + 1
    assert main(["drafter", "train", "--task", "chat", "--n", str(n), "--out", str(tmp_path / "d")]) == 2
    assert capsys.readouterr().err == (f"relaxspec: error: chat training prompts: n must be in 1..{n - 1} (the pool's "
                                       f"size), got {n}\n")
