import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny models on a shared 2-core machine: one thread avoids oversubscription.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def builtin_pair():
    from relaxspec.models import load_model

    return load_model("verifier"), load_model("drafter-weak")
