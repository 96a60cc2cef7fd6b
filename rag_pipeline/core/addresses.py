"""Which network addresses a fetch of someone else's URL may reach.

A sitemap, a link or a redirect names the URL, not us: left unchecked, a page could send the
crawler to 169.254.169.254 or a service on loopback and have the answer indexed and shown in
search. So only globally routable addresses are reached, except networks the operator names
(CRAWLER_ALLOW_NETWORKS, e.g. `127.0.0.0/8` for `make run`'s loopback site).
"""

from __future__ import annotations

import ipaddress
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

__all__ = ["Network", "parse_networks", "refusal", "host_refusal"]

Network = IPv4Network | IPv6Network
_NAT64 = IPv6Network("64:ff9b::/96")
# Names that resolve to this machine without asking DNS (RFC 6761), refused without a lookup.
_LOCAL_NAMES = ("localhost", "localhost.localdomain")


def parse_networks(spec: str | None) -> tuple[Network, ...]:
    """`"127.0.0.0/8, 10.1.0.0/16"` → networks; a bad entry is a ValueError naming it."""
    networks: list[Network] = []
    for item in (spec or "").replace(";", ",").split(","):
        item = item.strip()
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ValueError(f"not a network: {item!r} ({exc})") from None
    return tuple(networks)


def _embedded_ipv4(ip: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo, NAT64): checked as itself."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64:
        return IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _kind(ip: IPv4Address | IPv6Address) -> str | None:
    """Why `ip` is not globally routable ("loopback", …), or None when it is."""
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local (cloud metadata lives here)"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, IPv6Address) and ip.is_site_local:
        return "site-local"
    if ip.is_private:
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "not globally routable"
    return None


def refusal(address: str | IPv4Address | IPv6Address, allowed: tuple[Network, ...] = ()) -> str | None:
    """Why a connection to `address` is refused, or None when it may be made.

    An address inside an allowed network is fine whatever its kind, except the unspecified
    and multicast ones, which never name one web server.
    """
    try:
        ip = ipaddress.ip_address(str(address).split("%", 1)[0])   # drop an IPv6 zone (fe80::1%eth0)
    except ValueError:
        return f"{address!r} is not an IP address"
    checked = [ip]
    if isinstance(ip, IPv6Address) and (inner := _embedded_ipv4(ip)) is not None:
        # A mapped address is only its IPv4 one; the tunnelled kinds must pass as both.
        checked = [inner] if ip.ipv4_mapped is not None else [ip, inner]
    for each in checked:
        kind = _kind(each)
        if kind is None:
            continue
        if kind not in ("unspecified", "multicast") and any(each in net for net in allowed
                                                            if net.version == each.version):
            continue
        shown = f"{ip} (carrying {each})" if each is not ip else str(ip)
        return f"{shown} is a {kind} address; set CRAWLER_ALLOW_NETWORKS to crawl it"
    return None


def _bare(host: str) -> str:
    return host.strip("[]").rstrip(".").lower()


def _local_name(host: str) -> bool:
    return host in _LOCAL_NAMES or host.endswith(".localhost")


def names_this_machine(host: str) -> bool:
    """Whether a host name or IP literal is this machine: a local name or a loopback address
    (an IPv4-mapped one too)."""
    host = _bare(host)
    if _local_name(host):
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def host_refusal(host: str, allowed: tuple[Network, ...] = ()) -> str | None:
    """The same rule for a URL's host without a DNS lookup: an IP literal is checked, a name of
    this machine refused, any other name left to the check at connection time."""
    host = _bare(host)
    if _local_name(host):
        return refusal("127.0.0.1", allowed) and f"{host} names this machine; set CRAWLER_ALLOW_NETWORKS to crawl it"
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    return refusal(host, allowed)
