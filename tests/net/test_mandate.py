"""A coordinator's credential (kafila.net.mandate) in memory: the join code binds the host's certificate, and
mandates chain from it to each successor; anything else (another certificate, salt, session, signer, or a
chain past its bound) is refused."""

from __future__ import annotations

import pytest

from kafila.errors import ProtocolError
from kafila.net.mandate import MAX_LINKS, Credential, bound_secret, point_fingerprint, public_point, verify
from kafila.net.quic import Identity
from kafila.net.trust import JoinCode

pytestmark = pytest.mark.fast
SESSION = "k7q2m9xd"


def host_code(host: Identity) -> tuple[JoinCode, Credential]:
    credential = Credential.new_host()
    return JoinCode(SESSION, bound_secret(host.fingerprint, credential.salt)), credential


def test_the_code_binds_the_hosts_certificate_and_nobody_elses() -> None:
    host, mallory = Identity(), Identity()
    code, credential = host_code(host)
    assert JoinCode.parse(str(code)) == code  # a well-formed code, as a person types it
    assert verify(credential, code, host.fingerprint)
    assert not verify(credential, code, mallory.fingerprint)
    assert not verify(Credential.new_host(), code, host.fingerprint)  # another salt


def test_a_point_gives_its_certificates_fingerprint() -> None:
    me = Identity()
    assert point_fingerprint(public_point(me.key)) == me.fingerprint


def test_mandates_chain_from_the_host_to_each_successor_up_to_the_bound() -> None:
    host, heir, next_heir, mallory = Identity(), Identity(), Identity(), Identity()
    code, credential = host_code(host)
    first = credential.delegate(host.key, SESSION, heir.fingerprint)
    assert first is not None and verify(first, code, heir.fingerprint)
    assert not verify(first, code, mallory.fingerprint)  # the mandate names the heir, not its bearer
    second = first.delegate(heir.key, SESSION, next_heir.fingerprint)
    assert second is not None and len(second.links) == MAX_LINKS and verify(second, code, next_heir.fingerprint)
    assert second.delegate(next_heir.key, SESSION, mallory.fingerprint) is None
    assert Credential.from_json(second.as_json()) == second


def test_a_mandate_not_from_the_chain_is_refused() -> None:
    host, heir, mallory = Identity(), Identity(), Identity()
    code, credential = host_code(host)
    self_signed = credential.delegate(mallory.key, SESSION, mallory.fingerprint)
    other_session = credential.delegate(host.key, "zzzzzzzz", heir.fingerprint)
    assert self_signed is not None and other_session is not None
    assert not verify(self_signed, code, mallory.fingerprint)
    assert not verify(other_session, code, heir.fingerprint)
    good = credential.delegate(host.key, SESSION, heir.fingerprint)
    assert good is not None
    point, signature = good.links[0]
    flipped = Credential(good.salt, ((point, signature[:-1] + bytes([signature[-1] ^ 1])),))
    assert not verify(flipped, code, heir.fingerprint)
    assert not verify(Credential(good.salt, ((b"\x02" + b"\x00" * 32, signature),)), code, heir.fingerprint)


@pytest.mark.parametrize("announced", [None, "x", {}, {"salt": "zz", "links": []}, {"salt": "00" * 16},
                                       {"salt": "00" * 15, "links": []}, {"salt": "00" * 16, "links": [["0"]]},
                                       {"salt": "00" * 16, "links": [["00", "00"]] * (MAX_LINKS + 1)}])
def test_a_malformed_credential_is_a_protocol_error(announced: object) -> None:
    with pytest.raises(ProtocolError):
        Credential.from_json(announced)
