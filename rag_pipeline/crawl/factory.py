"""Which crawler the settings ask for: CRAWLER=crawlbase|local (crawlbase when a token is set)."""

from __future__ import annotations

from rag_pipeline.crawl.base import Crawler
from rag_pipeline.settings import Settings


def crawler_kind(settings: Settings) -> str:
    if settings.crawler:
        return settings.crawler
    return "crawlbase" if settings.crawlbase_token else "local"


def callback_url(settings: Settings) -> str:
    """Where the local crawler delivers: CRAWLER_CALLBACK_URL, else our receiver on WEBHOOK_PORT.
    The token goes in the X-Webhook-Token header (`make_crawler`), never in the URL, which proxies
    and access logs keep."""
    if settings.crawler_callback_url:
        return settings.crawler_callback_url
    return f"http://127.0.0.1:{settings.webhook_port}/webhook"


def make_crawler(settings: Settings) -> Crawler:
    kind = crawler_kind(settings)
    if kind == "crawlbase":
        from rag_pipeline.crawl.crawlbase import CrawlbaseCrawler

        return CrawlbaseCrawler(
            token=settings.crawlbase_token or "", crawler_name=settings.crawler_name or "",
            api_url=settings.crawlbase_api_url, rate=settings.crawler_push_rate,
            max_retries=settings.crawler_push_max_retries, backoff_s=settings.crawler_push_backoff_s,
            timeout_s=settings.crawler_timeout_s, page_wait_ms=settings.crawler_page_wait_ms,
            ajax_wait=settings.crawler_ajax_wait,
        )
    from rag_pipeline.crawl.local_crawler import LocalCrawler

    return LocalCrawler(
        callback_url=callback_url(settings), webhook_token=settings.resolved_webhook_token(),
        user_agent=settings.crawler_user_agent,
        timeout_s=settings.crawler_timeout_s, per_host=settings.crawler_per_host,
        delivery_retries=settings.crawler_delivery_retries,
        allowed_networks=settings.allowed_networks(), fetch_deadline_s=settings.crawler_fetch_deadline_s,
        obey_robots=settings.crawler_obey_robots, robots_ttl_s=settings.crawler_robots_ttl_s,
    )
