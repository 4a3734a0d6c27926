"""The fair queue's flow of a request: its tenant, or an anonymous caller's address (issue 25
item 2), from the peer and, behind a trusted proxy, the header the policy names."""

from __future__ import annotations

import pytest

from guard.admission import TrustedProxies, address_flow
from guard.exchange import Opened
from guard.gateway import build_gateway
from guard.policy import policy_from_yaml

# 4,097 characters: the 4 KiB read starts one character into "21.2.3.4", which is "1.2.3.4".
CUT_IN_TWO = "21.2.3.4".ljust(4097 - len(", 10.0.0.9")) + ", 10.0.0.9"


@pytest.mark.parametrize(
    ("peer", "forwarded", "trusted", "flow"),
    [
        ("10.0.0.7", None, (), "anonymous/10.0.0.7"),
        ("2001:db8:1:2:aaaa::1", None, (), "anonymous/2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", None, (), "anonymous/2001:db8:1:2::/64"),  # same /64
        ("::ffff:10.0.0.7", None, (), "anonymous/10.0.0.7"),
        # A client's own header is not believed from an untrusted peer ...
        ("10.0.0.7", "1.2.3.4", (), "anonymous/10.0.0.7"),
        # ... and is from a trusted proxy: the right-most address not a proxy's.
        ("10.0.0.2", "6.6.6.6, 1.2.3.4, 10.0.0.3", ("10.0.0.0/24",), "anonymous/1.2.3.4"),
        ("10.0.0.2", "junk, 1.2.3.4", ("10.0.0.0/24",), "anonymous/1.2.3.4"),
        # Envoy (peer None) appends the downstream address itself.
        (None, "5.6.7.8", (), "anonymous/5.6.7.8"),
        (None, None, (), "anonymous/unknown"),
        ("", None, (), "anonymous/unknown"),
        # Only the right-most 4 KiB is read: a client's padding cannot push the proxy's
        # entry out, and the entry cut in two is not taken for an address.
        ("10.0.0.2", "1.2.3.4," + " " * 5000 + ", 9.9.9.9", ("10.0.0.2",), "anonymous/9.9.9.9"),
        ("10.0.0.2", CUT_IN_TWO, ("10.0.0.0/24",), "anonymous/10.0.0.9"),
    ],
)
def test_anonymous_callers_are_flows_by_address(
    peer: str | None, forwarded: str | None, trusted: tuple[str, ...], flow: str
) -> None:
    assert address_flow(peer, forwarded, TrustedProxies(trusted)) == flow


@pytest.mark.parametrize(
    ("forwarded", "flow"),
    [
        ("for=192.0.2.60;proto=http;by=203.0.113.43", "anonymous/192.0.2.60"),
        ('for="[2001:db8:cafe::17]:4711"', "anonymous/2001:db8:cafe::/64"),
        ("For=192.0.2.43:47011", "anonymous/192.0.2.43"),  # names are case-insensitive
        # Right to left past the trusted proxies; the client's own entries to the left.
        ("for=6.6.6.6, for=192.0.2.60, for=10.0.0.3", "anonymous/192.0.2.60"),
        # An obfuscated or unknown node is no address: the last good one stands.
        ("for=_hidden, for=10.0.0.3", "anonymous/10.0.0.3"),
        ("for=unknown", "anonymous/10.0.0.2"),
        ("proto=https;by=10.0.0.3", "anonymous/10.0.0.2"),  # no for= at all
    ],
)
def test_the_standard_forwarded_header_is_read_by_its_for_parameters(
    forwarded: str, flow: str
) -> None:
    trusted = TrustedProxies(("10.0.0.0/24",))
    assert address_flow("10.0.0.2", forwarded, trusted, "forwarded") == flow


def test_the_gateway_reads_the_header_the_policy_names() -> None:
    policy = policy_from_yaml(
        "rate: {client_address_header: Forwarded, trusted_proxies: [10.0.0.0/24]}"
    )
    gw = build_gateway(policy, upstream=None)
    ex = gw.exchange("/v1/chat/completions", "POST")
    headers = [
        (b"content-length", b"2"),
        (b"x-forwarded-for", b"7.7.7.7"),  # not the one configured
        (b"forwarded", b"for=192.0.2.60"),
    ]
    opened = gw.open(ex, headers, "10.0.0.2")
    assert isinstance(opened, Opened)
    assert opened.flow == "anonymous/192.0.2.60"
    # From a peer that is not a trusted proxy, the header is the client's own claim.
    untrusted = gw.open(gw.exchange("/v1/chat/completions", "POST"), headers, "8.8.8.8")
    assert isinstance(untrusted, Opened)
    assert untrusted.flow == "anonymous/8.8.8.8"
