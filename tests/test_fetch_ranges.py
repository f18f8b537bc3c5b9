"""fetch refuses every special-purpose range, in every spelling, and the cache never bypasses the check."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import xzatoma_tools
from xzatoma_store import Store
from xzatoma_tools import ToolContext, address_block_reason, build_registry

BLOCKED = [
    # IPv4: IANA special-purpose ranges that are not globally reachable (and multicast)
    ("0.0.0.0", "'this network'"), ("0.255.255.255", "'this network'"), ("10.0.0.1", "private"),
    ("100.64.0.1", "carrier-grade NAT"), ("100.127.255.254", "carrier-grade NAT"), ("127.0.0.1", "loopback"),
    ("127.255.255.255", "loopback"), ("169.254.169.254", "link-local"), ("172.16.0.1", "private"),
    ("172.31.255.255", "private"), ("192.0.0.1", "IETF protocol"), ("192.0.0.9", "IETF protocol"),
    ("192.0.0.170", "IETF protocol"), ("192.0.0.255", "IETF protocol"), ("192.0.2.1", "documentation"),
    ("192.88.99.1", "6to4 relay"), ("192.168.0.1", "private"), ("198.18.0.1", "benchmarking"),
    ("198.19.255.255", "benchmarking"), ("198.51.100.7", "documentation"), ("203.0.113.9", "documentation"),
    ("224.0.0.1", "multicast"), ("239.255.255.250", "multicast"), ("240.0.0.1", "reserved"),
    ("254.255.255.255", "reserved"), ("255.255.255.255", "broadcast"),
    # IPv6 special-purpose ranges
    ("::", "unspecified"), ("::1", "loopback"), ("64:ff9b:1::1", "local-use NAT64"), ("100::1", "discard"),
    ("2001::1", "Teredo"), ("2001:2::1", "IETF protocol"), ("2001:1ff:ffff::1", "IETF protocol"),
    ("2001:db8::1", "documentation"), ("3fff::1", "documentation"), ("5f00::1", "segment-routing"),
    ("fc00::1", "unique-local"), ("fd12:3456::1", "unique-local"), ("fe80::1", "link-local"),
    ("febf::1", "link-local"), ("fec0::1", "site-local"), ("ff02::1", "multicast"), ("4000::1", "global unicast"),
    ("::2", "IPv4-compatible"),
    # IPv4 embedded in IPv6: mapped, NAT64, 6to4, IPv4-compatible, Teredo
    ("::ffff:127.0.0.1", "IPv4-mapped address embedding 127.0.0.1"), ("::ffff:192.0.0.8", "IPv4-mapped"),
    ("::ffff:a9fe:a9fe", "IPv4-mapped address embedding 169.254.169.254"),
    ("64:ff9b::7f00:1", "NAT64 address embedding 127.0.0.1"), ("64:ff9b::c000:1", "NAT64 address embedding 192.0.0.1"),
    ("64:ff9b::a00:1", "NAT64"), ("2002:7f00:1::", "6to4 address embedding 127.0.0.1"),
    ("2002:c000:0001::1", "6to4 address embedding 192.0.0.1"), ("2002:a9fe:a9fe::", "6to4"),
    ("::127.0.0.1", "IPv4-compatible"), ("::8.8.8.8", "IPv4-compatible"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"), ("fe80::1%eth0", "link-local"),
]

ALLOWED = ["8.8.8.8", "1.1.1.1", "93.184.216.34", "192.0.1.255", "192.0.3.0", "100.63.255.255", "100.128.0.0",
           "198.17.255.255", "198.20.0.0", "223.255.255.255", "2606:4700:4700::1111", "2a00:1450:4001::1",
           "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"]


@pytest.mark.parametrize("address,why", BLOCKED)
def test_special_purpose_addresses_are_blocked(address, why):
    reason = address_block_reason(address)
    assert reason and why in reason, (address, reason)


@pytest.mark.parametrize("address", ALLOWED)
def test_public_addresses_are_allowed(address):
    assert address_block_reason(address) is None


@pytest.mark.parametrize("url", ["http://192.0.0.1/", "http://3221225473/", "http://0xc0000001/", "http://192.0.1/",
                                 "http://[64:ff9b::c000:1]/", "http://[::ffff:c000:1]/"])
def test_192_0_0_0_is_blocked_in_every_spelling(url):
    verdict, reason = xzatoma_tools.url_verdict(url)
    assert verdict == "block", reason


class Server:
    def __init__(self):
        self.hits = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.hits += 1
                body = b"internal page\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = "http://127.0.0.1:%d/page" % self.httpd.server_address[1]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def fetch(tmp_path, store, allowed):
    cfg = {"allowed_hosts": list(allowed), "cache_ttl_seconds": 86400, "rate_limit_per_minute": 100}
    return build_registry("planning", ToolContext(str(tmp_path), {"fetch": cfg}, store=store))


def test_a_cached_page_is_served_only_if_its_url_passes_today(tmp_path, server):
    store = Store(str(tmp_path / "c.db")).open()
    first = fetch(tmp_path, store, ["127.0.0.1"]).execute("fetch", {"url": server.url})
    assert first.success and server.hits == 1
    again = fetch(tmp_path, store, ["127.0.0.1"]).execute("fetch", {"url": server.url})
    assert again.metadata.get("cached") is True and server.hits == 1
    # the host is no longer allowed: the cached copy is refused like a live fetch would be
    refused = fetch(tmp_path, store, []).execute("fetch", {"url": server.url})
    assert not refused.success and refused.error == "127.0.0.1 is a loopback address"
    assert "internal page" not in refused.to_message()


def test_a_planted_cache_entry_for_a_blocked_url_is_not_served(tmp_path):
    store = Store(str(tmp_path / "c.db")).open()
    # what an earlier version (or anyone who can write the cache) left behind
    store.cache_put("http://169.254.169.254/latest/meta-data/", 200, "text/plain",
                    "http://169.254.169.254/latest/meta-data/", "iam credentials")
    store.cache_put("http://93.184.216.34/redirected", 200, "text/plain", "http://10.0.0.5/admin", "admin page")
    reg = fetch(tmp_path, store, [])
    direct = reg.execute("fetch", {"url": "http://169.254.169.254/latest/meta-data/"})
    assert not direct.success and "link-local" in direct.error and "iam" not in direct.to_message()
    via = reg.execute("fetch", {"url": "http://93.184.216.34/redirected"})
    assert not via.success and via.error == "10.0.0.5 is a private address"


# ---- names that resolve to special-purpose addresses ----


# what the stub resolver answers (the tests never touch real DNS): name -> addresses
RESOLVES = {
    "mixed.test": ["93.184.216.34", "192.0.0.170"],  # one public, one IETF-protocol address
    "nat64-metadata.test": ["64:ff9b::a9fe:a9fe"],
    "compat.test": ["::10.0.0.1"],
    "sixtofour.test": ["2002:c0a8:0101::1"],
    "mapped.test": ["::ffff:192.0.0.8"],
    "teredo.test": ["2001:0:4136:e378:8000:63bf:3fff:fdd2"],
    "siit.test": ["::ffff:0:7f00:1"],
    "public.test": ["93.184.216.34"],
}


@pytest.fixture
def resolver(monkeypatch):
    import ipaddress
    import socket

    def getaddrinfo(host, port, *args, **kwargs):
        name = host.encode("idna").decode("ascii").lower().rstrip(".") if isinstance(host, str) else host
        try:
            addresses = [str(ipaddress.ip_address(name))]
        except ValueError:
            addresses = RESOLVES.get(name)
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port, 0, 0) if ":" in a else (a, port)) for a in addresses]
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return RESOLVES


BLOCKED_URLS = [
    "http://mixed.test/", "http://nat64-metadata.test/", "http://compat.test/", "http://sixtofour.test/",
    "http://mapped.test/", "http://teredo.test/", "http://siit.test/", "http://MIXED.test./",
    "http://\u2460\u2461\u2466.0.0.1/",  # circled digits: IDNA maps them to 127.0.0.1
    "http://127\u30020\u30020\u30021/", "http://127\uff0e0\uff0e0\uff0e1/",  # ideographic and full-width dots
    "http://0177.1/", "http://0x7f.1/", "http://2130706433./", "http://0x7f000001/", "http://127.0.0.1../",
    "http://[::ffff:7f00:1]/", "http://[0:0:0:0:0:ffff:127.0.0.1]/", "http://[::127.0.0.1]/",
    "http://192.0.0.8/", "http://3221225480/", "http://0300.0.0.010/", "http://[64:ff9b::c000:8]/",
    "http://[2002:c000:0008::]/", "http://user:pw@192.0.0.9:80/", "https://[fd00::1]:443/",
    "http://169.254.169.254.nip.io.@192.0.0.10/",
]


@pytest.mark.parametrize("url", BLOCKED_URLS)
def test_fetch_refuses_special_purpose_addresses_in_every_spelling(resolver, url):
    import xzatoma_tools
    verdict, reason = xzatoma_tools.url_verdict(url)
    assert verdict == "block", (url, reason)


def test_a_public_name_is_allowed_by_the_stub(resolver):
    import xzatoma_tools
    assert xzatoma_tools.url_verdict("http://public.test/")[0] == "allow"


def test_a_cached_page_whose_name_now_resolves_inside_is_not_served(resolver, tmp_path):
    # cached while the name was public; the name now resolves to a blocked address (rebinding)
    from xzatoma_store import Store
    from xzatoma_tools import ToolContext, build_registry
    store = Store(str(tmp_path / "c.db")).open()
    store.cache_put("http://rebound.test/page", 200, "text/plain", "http://rebound.test/page", "cached secret page")
    resolver["rebound.test"] = ["10.1.2.3"]
    ctx = ToolContext(str(tmp_path), {"fetch": {"cache_ttl_seconds": 86400, "rate_limit_per_minute": 100}},
                      store=store)
    result = build_registry("planning", ctx).execute("fetch", {"url": "http://rebound.test/page"})
    assert not result.success and "10.1.2.3" in result.error and "private" in result.error
    assert "cached secret page" not in result.to_message()
    store.close()
