"""The crawler resource: CRAWLER=crawlbase|local behind one interface (push a URL, read health)."""

import threading

import dagster as dg

from rag_pipeline.crawl.base import Crawler
from rag_pipeline.settings import Settings, get_settings

_crawlers: dict[tuple, Crawler] = {}
_crawlers_lock = threading.Lock()


class CrawlerResource(dg.ConfigurableResource):
    """Unset fields fall back to the environment (CRAWLER, CRAWLBASE_API_URL, … see README)."""

    kind: str | None = None
    api_url: str | None = None
    callback_url: str | None = None

    def settings(self) -> Settings:
        overrides = {"crawler": self.kind, "crawlbase_api_url": self.api_url,
                     "crawler_callback_url": self.callback_url}
        return get_settings().model_copy(update={k: v for k, v in overrides.items() if v is not None})

    def get(self) -> Crawler:
        from rag_pipeline.crawl.factory import callback_url, crawler_kind, make_crawler

        settings = self.settings()
        key = (crawler_kind(settings), settings.crawlbase_api_url, settings.crawlbase_token,
               settings.crawler_name, callback_url(settings))
        with _crawlers_lock:
            if key not in _crawlers:
                _crawlers[key] = make_crawler(settings)
            return _crawlers[key]


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(resources={"crawler": CrawlerResource()})
