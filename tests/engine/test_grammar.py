"""The grammar state over SmolLM2's vocabulary (llama.cpp's grammar engine): which tokens it allows, the end only
where the grammar is complete, the sampler's cheap check giving what full constraint gives, a resumed reply's
tokens advancing it, and a refused token an error rather than llama.cpp's abort."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kafila.engine.grammar import Grammar, GrammarError, json_object_grammar, schema_grammar
from kafila.engine.sampler import Sampler, SamplingParams
from kafila.engine.vocab import Vocab
from tests.conftest import reference_llama

pytestmark = pytest.mark.fast

YES_NO = 'root ::= "yes" | "no"'
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
NUMBERS = {"type": "array", "items": {"type": "integer"}, "minItems": 12}


@pytest.fixture(scope="module")
def vocab(smollm: Path) -> Iterator[Vocab]:
    with reference_llama(smollm, vocab_only=True) as m:
        yield Vocab(m._model.vocab, None)


def allowed(g: Grammar, n: int) -> set[int]:
    return set(np.flatnonzero(np.isfinite(g.mask(np.zeros(n, dtype=np.float32)))).tolist())


def test_the_end_is_allowed_only_where_the_grammar_is_complete(vocab: Vocab) -> None:
    g = Grammar(vocab, YES_NO)
    first = allowed(g, vocab.n_tokens)
    assert first and all(vocab.piece(t) and (b"yes".startswith(vocab.piece(t)) or b"no".startswith(vocab.piece(t)))
                         for t in first)
    assert not g.allows(vocab.eos) and all(g.allows(t) for t in first)
    for t in vocab.tokenize("yes", add_special=False):
        g.accept(t)
    assert g.allows(vocab.eos) and allowed(g, vocab.n_tokens) == {t for t in range(vocab.n_tokens) if vocab.is_end(t)}


def test_a_refused_token_is_an_error_not_llama_cpps_abort(vocab: Vocab) -> None:
    g = Grammar(vocab, YES_NO)
    with pytest.raises(GrammarError, match="does not follow"):
        g.accept(vocab.tokenize("maybe", add_special=False)[0])
    g.accept(vocab.tokenize("no", add_special=False)[0])  # the refusal left the state as it was


@pytest.mark.parametrize("bad", ["root ::= undefined", 'root ::= root "a"', 'start ::= "a"', "root ::= [a-"])
def test_a_grammar_llama_cpp_refuses_is_a_grammar_error(vocab: Vocab, bad: str) -> None:
    with pytest.raises(GrammarError, match="does not compile"):
        Grammar(vocab, bad)


def test_a_schema_the_converter_refuses_is_a_grammar_error_saying_why() -> None:
    with pytest.raises(GrammarError, match="Unrecognized schema"):
        schema_grammar({"type": "object", "properties": {"a": {"type": "strin"}}})
    assert "root ::=" in schema_grammar(SCHEMA) and "root" in json_object_grammar()


@pytest.mark.parametrize("grammar", ["schema", "object"])
def test_a_json_string_takes_no_raw_control_character(vocab: Vocab, grammar: str) -> None:
    # llama-cpp-python's converter alone lets a newline into a string: a reply json.loads refuses
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    g = Grammar(vocab, schema_grammar(schema) if grammar == "schema" else json_object_grammar())
    for t in vocab.tokenize('{"a": "x', add_special=False):
        g.accept(t)
    for bad in ("\n", "\t", "\x01"):
        assert not g.allows(vocab.tokenize(bad, add_special=False)[0]), repr(bad)
    assert g.allows(vocab.tokenize("y", add_special=False)[0])


def test_a_clone_goes_its_own_way_and_both_free(vocab: Vocab) -> None:
    g = Grammar(vocab, YES_NO)
    y, n = vocab.tokenize("y", add_special=False)[0], vocab.tokenize("n", add_special=False)[0]
    other = g.clone()
    g.accept(y)
    assert not g.allows(n) and other.allows(n) and other.allows(y)
    other.close()
    other.close()  # freeing twice is harmless (the finaliser runs once)
    assert g.allows(vocab.tokenize("es", add_special=False)[0])


def walk(vocab: Vocab, params: SamplingParams, steps: int = 40) -> tuple[int, int]:
    """Sample up to `steps` tokens of NUMBERS from seeded random logits, every other step with an allowed token
    lifted to the top (the cheap path); greedy must equal the argmax of the fully masked row at every step.
    Returns how often the drawn token passed at once and how often the row had to be constrained."""
    rng = np.random.default_rng(5)
    sampler = Sampler(params, grammar=Grammar(vocab, schema_grammar(NUMBERS)))
    shadow = Grammar(vocab, schema_grammar(NUMBERS))  # the same state, advanced alongside
    at_once = masked = 0
    for step in range(steps):
        row = rng.normal(0, 3, vocab.n_tokens).astype(np.float32)
        full = shadow.mask(row)
        if step % 2:
            row[int(rng.choice(np.flatnonzero(np.isfinite(full))))] = 50.0
            full = shadow.mask(row)
        plain = int(np.argmax(row))
        token = sampler.sample(row)
        assert np.isfinite(full[token])
        if params.temperature == 0:
            assert token == int(np.argmax(full))
        at_once, masked = at_once + shadow.allows(plain), masked + (not shadow.allows(plain))
        if vocab.is_end(token):
            break
        sampler.accept(token)
        shadow.accept(token)
    return at_once, masked


@pytest.mark.parametrize("params", [SamplingParams(0.0), SamplingParams(1.0, 40, 0.95, seed=3),
                                    SamplingParams(0.8, 0, 1.0, seed=4, min_p=0.05, repeat_penalty=1.3)])
def test_the_cheap_check_samples_only_allowed_tokens_and_greedy_as_full_constraint(vocab: Vocab,
                                                                                   params: SamplingParams) -> None:
    at_once, masked = walk(vocab, params)
    assert at_once > 5 and masked > 5  # both paths were taken


def test_a_resumed_reply_advances_the_grammar_and_one_that_breaks_it_is_refused(vocab: Vocab) -> None:
    reply = vocab.tokenize('{"name": "Ada", "age"', add_special=False)
    sampler = Sampler(SamplingParams(0.0), [1, 2, 3], reply, Grammar(vocab, schema_grammar(SCHEMA)))
    assert sampler.grammar is not None and sampler.grammar.allows(vocab.tokenize(":", add_special=False)[0])
    assert not sampler.grammar.allows(vocab.tokenize("}", add_special=False)[0])
    with pytest.raises(GrammarError):
        Sampler(SamplingParams(0.0), [], vocab.tokenize('{"nom"', add_special=False),
                Grammar(vocab, schema_grammar(SCHEMA)))


def test_a_grammar_no_token_can_follow_is_an_error(vocab: Vocab) -> None:
    sampler = Sampler(SamplingParams(0.0), grammar=Grammar(vocab, 'root ::= "{"'))
    row = np.zeros(vocab.n_tokens, dtype=np.float32)
    row[vocab.tokenize("{", add_special=False)[0]] = -np.inf  # the only token the grammar allows, banned
    with pytest.raises(GrammarError, match="allows no token"):
        sampler.sample(row)
