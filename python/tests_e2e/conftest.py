"""What the end-to-end tests share: the random-weight tiny Llama (and its word-level tokenizer), made
once per machine without a download."""

import pytest

from serving import tiny_model


@pytest.fixture(scope="session")
def model():
    return tiny_model()
