"""What the models layer says about what it cannot do: a prompt longer than the context, a model without a name."""

import pytest

from relaxspec.models import load_model
from relaxspec.models.prompts import check_context


def test_context_error_offers_nothing_that_does_not_exist():
    with pytest.raises(ValueError) as e:
        check_context([[1] * 600], 10, load_model("verifier"))
    assert "truncat" not in str(e.value) and "shorten it or lower max_new_tokens" in str(e.value)


@pytest.mark.parametrize("name", [None, 3, "", "  "])
def test_load_model_without_a_name_is_one_line(name):
    with pytest.raises(ValueError, match=r"^load_model needs a model's name or path \(`relaxspec models list` names "):
        load_model(name)
