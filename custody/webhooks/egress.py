"""Which addresses the webhooks worker may POST to (SSRF guard), and the pinned target of one POST.

The worker runs inside the network: it can reach the database, the nodes' RPC ports, the signer's
host and a cloud's instance-metadata service. A webhook URL must therefore name a public address:
a host that is (or resolves only to) a loopback, link-local, private, shared (CGNAT), unspecified,
multicast, reserved or otherwise non-global address is refused, unless that address is inside one
of the networks of `WEBHOOK_ALLOW_PRIVATE_HOSTS` (comma-separated IP addresses or CIDR networks,
e.g. `10.20.0.0/16,127.0.0.1`; empty by default). IPv4-mapped IPv6 addresses are judged as the
IPv4 address they carry.

It is checked twice:
- when an admin registers the URL (`check_host`, from custody.webhooks.endpoints.check_url): a
  literal address, or every address the name resolves to now; a name that does not resolve yet is
  accepted (nothing can be sent to it) and checked at each send;
- before every POST (`pinned_target`): the name is resolved again, every address is checked (DNS
  may have changed), and the POST goes to the checked address itself (URL host replaced by it, the
  original `Host` header and TLS server name kept), so a second lookup by the HTTP client cannot
  return another address (DNS rebinding).

Errors: `EgressRefused(reason)`, `reason` one of `address_refused` (an internal address outside the
allow-list) and `resolve_failed` (the name has no address); the worker stores only that word as
the attempt's `last_error`, never the resolver's or the socket's text.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class EgressRefused(Exception):
    """The URL's host may not be sent to; `reason` is `address_refused` or `resolve_failed`."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


def parse_allowed(spec: str | None) -> tuple[IPNetwork, ...]:
    """`WEBHOOK_ALLOW_PRIVATE_HOSTS` as networks; raises ValueError naming a bad entry."""
    networks = []
    for part in (spec or "").split(","):
        part = part.strip()
        if part:
            try:
                networks.append(ipaddress.ip_network(part, strict=False))
            except ValueError:
                raise ValueError(f"WEBHOOK_ALLOW_PRIVATE_HOSTS: {part!r} is not an IP address or CIDR network") from None
    return tuple(networks)


def _plain(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_internal(ip: IPAddress) -> bool:
    ip = _plain(ip)
    return (not ip.is_global or ip.is_loopback or ip.is_link_local or ip.is_private or ip.is_unspecified
            or ip.is_multicast or ip.is_reserved)


def refused(ip: IPAddress, allowed: tuple[IPNetwork, ...]) -> bool:
    """True when `ip` is internal and no allowed network contains it."""
    plain = _plain(ip)
    return is_internal(plain) and not any(plain.version == n.version and plain in n for n in allowed)


def literal_ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def _check_all(host: str, addresses: list[IPAddress], allowed: tuple[IPNetwork, ...]) -> list[IPAddress]:
    if not addresses:
        raise EgressRefused("resolve_failed", f"{host} has no address")
    bad = [str(ip) for ip in addresses if refused(ip, allowed)]
    if bad:
        raise EgressRefused("address_refused",
                            f"{host} is (or resolves to) an internal address ({', '.join(sorted(set(bad)))}); "
                            f"webhooks go to public addresses only (WEBHOOK_ALLOW_PRIVATE_HOSTS lists exceptions)")
    return addresses


def _addresses(infos: list) -> list[IPAddress]:  # noqa: ANN001 - getaddrinfo's tuples
    seen: dict[IPAddress, None] = {}
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6):
            seen.setdefault(ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]), None)
    return list(seen)


def check_host(host: str, port: int, allowed: tuple[IPNetwork, ...]) -> None:
    """At registration: refuse a literal internal address or a name resolving to one. A name that
    does not resolve now passes (the send-time check refuses it until it does, to a public address)."""
    ip = literal_ip(host)
    if ip is not None:
        _check_all(host, [ip], allowed)
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return
    _check_all(host, _addresses(infos), allowed)


@dataclass(frozen=True)
class Target:
    url: str  # the URL with its host replaced by the checked address
    host_header: str  # the original host[:port]
    sni_hostname: str | None  # for https to a name: the name the certificate must match


async def pinned_target(url: str, allowed: tuple[IPNetwork, ...]) -> Target:
    """Resolve the URL's host now, check every address, and aim the POST at the first one."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    ip = literal_ip(host)
    if ip is not None:
        addresses = _check_all(host, [ip], allowed)
        sni = None
    else:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise EgressRefused("resolve_failed", f"{host} does not resolve") from None
        addresses = _check_all(host, _addresses(infos), allowed)
        sni = host if parts.scheme == "https" else None
    chosen = addresses[0]
    netloc = (f"[{chosen}]" if chosen.version == 6 else str(chosen)) + (f":{parts.port}" if parts.port else "")
    host_header = parts.netloc.rsplit("@", 1)[-1]
    return Target(urlunsplit((parts.scheme, netloc, parts.path, parts.query, "")), host_header, sni)
