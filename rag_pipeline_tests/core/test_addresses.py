"""The network guard's rule: which addresses a fetch of someone else's URL may reach."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_pipeline.core.addresses import host_refusal, names_this_machine, parse_networks, refusal


@pytest.mark.parametrize("address, kind", [
    ("127.0.0.1", "loopback"), ("127.9.9.9", "loopback"), ("::1", "loopback"),
    ("169.254.169.254", "link-local"), ("fe80::1%eth0", "link-local"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"), ("fd00::1", "private"),
    ("100.64.0.1", "not globally routable"), ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("224.0.0.1", "multicast"), ("ff02::1", "multicast"), ("fec0::1", "site-local"),
    ("240.0.0.1", "private"),
    # IPv6 spellings of refused IPv4 addresses: mapped, 6to4 (NAT64 is reserved as a whole).
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:169.254.169.254", "link-local"),
    ("2002:7f00:1::", "127.0.0.1"), ("64:ff9b::a9fe:a9fe", "reserved"),
])
def test_non_public_addresses_are_refused_with_their_kind(address, kind):
    reason = refusal(address)
    assert reason is not None and kind in reason
    assert "CRAWLER_ALLOW_NETWORKS" in reason


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_pass(address):
    assert refusal(address) is None


def test_an_allowed_network_lets_exactly_its_addresses_through():
    allowed = parse_networks("127.0.0.0/8, 10.1.0.0/16")
    assert refusal("127.0.0.1", allowed) is None
    assert refusal("::ffff:127.0.0.1", allowed) is None     # the same address, mapped
    assert refusal("10.1.200.3", allowed) is None
    assert "private" in refusal("10.2.0.1", allowed)
    assert "link-local" in refusal("169.254.169.254", allowed)
    assert "loopback" in refusal("::1", allowed)              # IPv6 loopback is another network


def test_unspecified_and_multicast_stay_refused_even_when_listed():
    allowed = parse_networks("0.0.0.0/0, ::/0")
    assert "unspecified" in refusal("0.0.0.0", allowed)
    assert "multicast" in refusal("224.0.0.1", allowed)
    assert refusal("10.0.0.1", allowed) is None


def test_a_bad_network_setting_names_the_entry():
    with pytest.raises(ValueError, match="not a network: 'nope'"):
        parse_networks("127.0.0.0/8, nope")
    assert parse_networks("") == ()
    assert parse_networks(" 10.0.0.0/8 ; ::1 ") == (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1"))


@pytest.mark.parametrize("host, refused", [
    ("localhost", True), ("LOCALHOST.", True), ("app.localhost", True), ("127.0.0.1", True),
    ("[::1]", True), ("169.254.169.254", True), ("example.com", False), ("93.184.216.34", False),
])
def test_a_url_host_is_checked_without_dns(host, refused):
    assert (host_refusal(host) is not None) is refused


@given(st.ip_addresses())
def test_every_address_either_passes_or_gets_a_reason(ip):
    reason = refusal(ip)
    if reason is None:
        assert ip.is_global and not ip.is_multicast
    else:
        assert str(ip) in reason


@pytest.mark.parametrize("host, local", [
    ("localhost", True), ("LOCALHOST.", True), ("localhost.localdomain", True), ("db.localhost", True),
    ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("[::1]", True), ("::ffff:127.0.0.1", True),
    ("postgres", False), ("10.0.0.5", False), ("db.example.com", False), ("::ffff:10.0.0.5", False)])
def test_a_host_names_this_machine_only_by_a_local_name_or_a_loopback_address(host, local):
    assert names_this_machine(host) is local
