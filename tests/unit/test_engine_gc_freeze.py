"""A serving engine moves what is alive once it is loaded into the collector's permanent generation
(EngineConfig.freeze_gc; inference/engine.py): full collections then skip the model's and the
libraries' objects.  Other engines (tests, scripts) leave the collector alone."""

import gc

import pytest

from api.engine import engine_configs
from testing.tiny_engine import start_tiny_engine


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()  # the test process's objects stay collectable for the tests after this one


def test_an_engine_that_serves_freezes_what_is_alive_before_it_says_ready(unfrozen):
    engine = start_tiny_engine(freeze_gc=True)
    try:
        assert engine.ready
        assert gc.get_freeze_count() > 1000  # the tiny model, the tokenizer, torch's and Django's modules
        assert engine not in gc.get_objects()  # frozen: out of every generation the collector walks
    finally:
        engine.stop()


def test_an_engine_leaves_the_collector_alone_unless_asked(unfrozen):
    engine = start_tiny_engine()
    try:
        assert gc.get_freeze_count() == 0
    finally:
        engine.stop()


def test_the_servers_engine_freezes():
    assert engine_configs()[1].freeze_gc
