"""Crawling: one small interface (push a URL, read health) over Crawlbase and the local crawler,
plus the Crawlbase simulator and the loopback site used by tests, benchmarks and `make run`."""
