"""Whose turn it is in the global queue: a request's fair-queuing flow.

A caller with an API key is its tenant. Anonymous callers (no keys configured, or the tenant
``anonymous``) are told apart by address, so that one client flooding the guard does not take
the others' share: an IPv4 address, or an IPv6 address's /64 (one host's share of a network is
usually a whole /64, and a client could otherwise be many flows). Behind a proxy the peer is the
proxy: its header (``x-forwarded-for``) is read only when the peer is one of the trusted proxies
the policy lists, and then the right-most address in it that is not itself a trusted proxy is
the client's (the entries to its left are whatever the client sent). The standard
``Forwarded`` header (RFC 7239) is read by its ``for=`` parameters when it is the one
configured; an obfuscated or ``unknown`` node there is no address, like any garbage.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

__all__ = ["ANONYMOUS_FLOW_PREFIX", "TrustedProxies", "address_flow"]

# Anonymous flows are named by address after this; "/" is in no tenant's name, so no key's
# flow can be taken for an address's.
ANONYMOUS_FLOW_PREFIX = "anonymous/"

# Only the right-most part of a header value is read (to its left, the client's own padding).
_MAX_HEADER = 4096
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class TrustedProxies:
    """The proxies whose client-address header is believed (CIDRs; empty: none)."""

    __slots__ = ("_networks",)

    def __init__(self, cidrs: Sequence[str] = ()) -> None:
        self._networks: tuple[_Network, ...] = tuple(
            ipaddress.ip_network(cidr, strict=False) for cidr in cidrs
        )

    def __bool__(self) -> bool:
        return bool(self._networks)

    def trusts(self, address: _Address | None) -> bool:
        return address is not None and any(address in net for net in self._networks)


def _parse(text: str) -> _Address | None:
    text = text.strip()
    if text.startswith("["):  # [v6]:port
        text = text[1 : text.find("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.partition(":")[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _for_node(element: str) -> str:
    """The node of a ``Forwarded`` element's ``for=`` parameter (``""``: none)."""
    for pair in element.split(";"):
        name, _, value = pair.partition("=")
        if name.strip().lower() == "for":
            return value.strip().strip('"')
    return ""


def _hops(header: str, value: str) -> list[str]:
    if len(value) > _MAX_HEADER:
        # The right end is the proxies' (read first); the cut entry at the left is dropped,
        # as a part of an address can read as another address.
        value = value[-_MAX_HEADER:].partition(",")[2]
    elements = value.split(",")
    return [_for_node(e) for e in elements] if header == "forwarded" else elements


def _client(
    peer: str | None, forwarded: str | None, trusted: TrustedProxies, header: str
) -> _Address | None:
    address = _parse(peer) if peer else None
    if forwarded is None or (peer is not None and not trusted.trusts(address)):
        return address
    for hop in reversed(_hops(header, forwarded)):
        hop_address = _parse(hop)
        if hop_address is None:
            break  # garbage from the client's side: the last good address stands
        address = hop_address
        if not trusted.trusts(hop_address):
            break
    return address


def address_flow(
    peer: str | None,
    forwarded: str | None,
    trusted: TrustedProxies,
    header: str = "x-forwarded-for",
) -> str:
    """The flow of an anonymous request from ``peer`` (``""``: unknown; None: a proxy that
    appends the client's address to the header, i.e. Envoy) with the value of the
    client-address ``header`` (None: absent)."""
    address = _client(peer, forwarded, trusted, header)
    if address is None:
        return f"{ANONYMOUS_FLOW_PREFIX}unknown"
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped
        if mapped is None:
            return f"{ANONYMOUS_FLOW_PREFIX}{ipaddress.IPv6Network((address, 64), strict=False)}"
        address = mapped
    return f"{ANONYMOUS_FLOW_PREFIX}{address}"
